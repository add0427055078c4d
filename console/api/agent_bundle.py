"""``POST /api/v1/agent/bundle``: a node's forwarder sends its ranks' requests in one
(docs/protocol.md "Bundles"; the service is ``breakers.agent.bundle``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers.agent.bundle import MAX_BUNDLE_PARTS
from console.api.agent import ERRORS, AgentView
from console.api.agent_auth import agent_job
from console.api.agent_endpoints import bundle


class BundlePartDoc(serializers.Serializer):
    path = serializers.RegexField(
        r"^(metrics|heartbeat|commands/[0-9]{1,19}/ack)$",
        help_text="The rank's own request: metrics, heartbeat or commands/<id>/ack.",
    )
    body = serializers.CharField(
        help_text="The body that rank would have posted on its own, as a JSON string."
    )


class BundleDoc(serializers.Serializer):
    parts = BundlePartDoc(
        many=True,
        help_text=f"1 to {MAX_BUNDLE_PARTS} parts, each served as its own request would be.",
    )


class BundleResultDoc(serializers.Serializer):
    status = serializers.IntegerField(help_text="The part's own HTTP status (202, 200, 4xx).")
    body = serializers.DictField(help_text="The part's own answer (or its error).")


class BundleAnsweredDoc(serializers.Serializer):
    results = BundleResultDoc(many=True, help_text="One per part, in the parts' order.")


class BundleView(AgentView):
    @extend_schema(
        operation_id="agent_bundle",
        request=BundleDoc,
        responses={200: BundleAnsweredDoc, **ERRORS},
        tags=["agent"],
        summary="A node's ranks' metrics, heartbeats and acknowledgements in one request",
    )
    def post(self, request: Request) -> Response:
        status, reply = bundle(agent_job(request), self.raw_body(request), None)
        return Response(reply, status=status)
