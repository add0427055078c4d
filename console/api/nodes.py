"""A node of my teams' jobs: its state (healthy / drained by which alert / returned), and
returning a drained node to service (a manager;
``breakers.control.nodes.return_node_to_service``)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers.control.nodes import node_payload, return_node_to_service, visible_node
from console.api.agent_schema import ErrorDoc
from console.api.person_auth import PersonView, audit_context, error_responses


class NodeOut(serializers.Serializer):
    id = serializers.IntegerField()
    hostname = serializers.CharField()
    job = serializers.DictField(help_text="id, name, team_id")
    status = serializers.CharField(help_text="The node's status in the job: healthy, failed, …")
    state = serializers.CharField(
        help_text="drained (by drain.alert), returned (by drain.returned_by), or the status "
        "when Brakeline never drained it"
    )
    drain = serializers.DictField(
        allow_null=True,
        help_text="The latest drain: slurm_node, reason, alert {id, rule, severity}, "
        "incident_id, command_id, drained_at, requeued_at, returned_at, returned_by",
    )
    binding = serializers.ChoiceField(
        choices=["operator", "scheduler", "agent"],
        help_text="How the node is known to be the job's: bound by an operator or by Slurm's "
        "own answer, or 'agent': reported by the agent, unverified (hardware alerts then page "
        "but never act automatically)",
    )
    scheduler = serializers.DictField(
        allow_null=True, help_text="executor, slurm_job_id, slurm_nodelist of the node's job"
    )


class ResumeNodeIn(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)


SCHEDULER_FAILED = OpenApiResponse(
    ErrorDoc, description="Slurm refused (`detail` has its output); recorded on the timeline."
)


class NodeDetailView(PersonView):
    @extend_schema(
        tags=["nodes"],
        summary="One node of my teams' jobs, with its drain state",
        responses={200: NodeOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(node_payload(visible_node(request.user, pk)))


class ResumeNodeView(PersonView):
    @extend_schema(
        tags=["nodes"],
        summary="Return a drained node to service (manager and above)",
        description="`scontrol update nodename=… state=resume`, recorded on the timeline of "
        "the incident that drained it. 409 when Brakeline has no open drain of the node.",
        request=ResumeNodeIn,
        responses={200: NodeOut, **error_responses(400, 401, 403, 404, 409), 502: SCHEDULER_FAILED},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = ResumeNodeIn(data=request.data)
        body.is_valid(raise_exception=True)
        drain = return_node_to_service(
            pk,
            request.user,
            reason=body.validated_data.get("reason", ""),
            context=audit_context(request),
        )
        return Response(node_payload(drain.node))
