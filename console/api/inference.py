"""``POST /api/v1/agent/replicas/heartbeat``: a replica of an inference job says it is alive,
and healthy or not (docs/protocol.md "Replicas"). The service is
``breakers.control.replicas``; this is only the HTTP shape."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.agent import ERRORS, AgentView
from console.api.agent_auth import agent_job
from console.api.agent_endpoints import replica_heartbeat

ReplicaHeartbeatDoc = inline_serializer(
    "ReplicaHeartbeat",
    {
        "replica": serializers.RegexField(
            r"^[A-Za-z0-9_.:\-]{1,100}$", help_text="The load balancer's server name."
        ),
        "backend": serializers.RegexField(
            r"^[A-Za-z0-9_.:\-]{1,100}$", help_text="The load balancer's backend."
        ),
        "pid": serializers.IntegerField(required=False, min_value=2),
        "hostname": serializers.CharField(required=False, max_length=255),
        "healthy": serializers.BooleanField(help_text="What the replica's health hook says."),
        "detail": serializers.CharField(required=False, max_length=500),
        "draining": serializers.BooleanField(required=False),
    },
)
ReplicaReplyDoc = inline_serializer(
    "ReplicaHeartbeatReply",
    {
        "replica": serializers.CharField(),
        "status": serializers.ChoiceField(choices=["serving", "draining", "restarting", "failed"]),
        "commands": serializers.ListField(
            child=serializers.DictField(),
            help_text='What the replica must do itself: [{"action": "drain" | "restart"}].',
        ),
    },
)


class ReplicaHeartbeatView(AgentView):
    @extend_schema(
        operation_id="agent_replica_heartbeat",
        request=ReplicaHeartbeatDoc,
        responses={200: ReplicaReplyDoc, **ERRORS},
        tags=["agent"],
        summary="Heartbeat of one replica of an inference job, with its health",
    )
    def post(self, request: Request) -> Response:
        status, reply = replica_heartbeat(agent_job(request), self.raw_body(request), None)
        return Response(reply, status=status)
