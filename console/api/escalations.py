"""Escalation requests: on-call asks, a manager (never the requester) approves or rejects."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from breakers.control.escalations import (
    approve_escalation,
    reject_escalation,
    request_escalation,
)
from console.api.alerts import LIMIT_PARAMETER, limit_param
from console.api.params import id_param
from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from core.errors import InvalidInput
from incidents.escalations import (
    ESCALATION_KINDS,
    escalation_payload,
    scoped_request,
)
from incidents.models import EscalationRequest, EscalationStatus, OnExpiry
from incidents.teams.access import visible_team_ids


class RequestedCommandIn(serializers.Serializer):
    kind = serializers.ChoiceField(choices=list(ESCALATION_KINDS))
    params = serializers.DictField(
        required=False,
        help_text='lower_lr: {"factor": 0 < f < 1}; isolate_node: {"node": "…"}; others: {}.',
    )


class EscalationIn(serializers.Serializer):
    job_id = serializers.IntegerField()
    alert_id = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="The alert escalated; its level decides (requests are made on L1/L2 alerts).",
    )
    command = RequestedCommandIn()
    reason = serializers.CharField(max_length=2000)
    on_expiry = serializers.ChoiceField(
        choices=OnExpiry.choices,
        default=OnExpiry.NOTIFY,
        help_text="What happens when nobody decides in time: notify the next manager, or also "
        "checkpoint and pause automatically (L3, by the system).",
    )


class DecisionIn(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class EscalationOut(serializers.Serializer):
    id = serializers.IntegerField()
    job_id = serializers.IntegerField()
    alert_id = serializers.IntegerField(allow_null=True)
    incident_id = serializers.IntegerField(allow_null=True)
    level = serializers.CharField(allow_null=True)
    command = RequestedCommandIn()
    reason = serializers.CharField()
    on_expiry = serializers.ChoiceField(choices=OnExpiry.choices)
    status = serializers.ChoiceField(choices=EscalationStatus.choices)
    requested_by = serializers.CharField()
    requested_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    decided_by = serializers.CharField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)
    decision_note = serializers.CharField()
    command_id = serializers.IntegerField(
        allow_null=True, help_text="The command issued on approval (or by an automatic L3)."
    )


class EscalationListView(PersonView):
    @extend_schema(
        tags=["escalations"],
        summary="Escalation requests of my teams, newest first",
        parameters=[
            OpenApiParameter("status", OpenApiTypes.STR, description="pending, approved, …"),
            OpenApiParameter("job", OpenApiTypes.INT),
            LIMIT_PARAMETER,
        ],
        responses={200: EscalationOut(many=True), **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        requests = EscalationRequest.objects.filter(
            job__team_id__in=visible_team_ids(request.user)
        ).select_related("job", "requested_by", "decided_by")
        status = request.query_params.get("status")
        if status is not None:
            if status not in EscalationStatus.values:
                raise InvalidInput("Bad status.", fields={"status": ", ".join(EscalationStatus)})
            requests = requests.filter(status=status)
        job = id_param(request, "job")
        if job is not None:
            requests = requests.filter(job_id=job)
        return Response([escalation_payload(r) for r in requests[: limit_param(request)]])

    @extend_schema(
        tags=["escalations"],
        summary="Request an escalation (on-call and above, on an L1/L2 alert)",
        description="Takes effect only when a manager approves it: the command is then issued "
        "at once. Undecided within the policy time, it expires.",
        request=EscalationIn,
        responses={201: EscalationOut, **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request) -> Response:
        body = EscalationIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        escalation = request_escalation(
            request.user,
            data["job_id"],
            kind=data["command"]["kind"],
            params=data["command"].get("params") or {},
            reason=data["reason"],
            alert_id=data.get("alert_id"),
            on_expiry=data["on_expiry"],
            context=audit_context(request),
        )
        return Response(escalation_payload(escalation), status=201)


class EscalationDetailView(PersonView):
    @extend_schema(
        tags=["escalations"],
        summary="One escalation request of my teams",
        responses={200: EscalationOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        return Response(escalation_payload(scoped_request(request.user, pk)))


class ApproveEscalationView(PersonView):
    @extend_schema(
        tags=["escalations"],
        summary="Approve a request (manager, never your own): the command is issued at once",
        request=DecisionIn,
        responses={200: EscalationOut, **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = DecisionIn(data=request.data)
        body.is_valid(raise_exception=True)
        escalation = approve_escalation(
            request.user,
            pk,
            note=body.validated_data.get("note", ""),
            context=audit_context(request),
        )
        return Response(escalation_payload(escalation))


class RejectEscalationView(PersonView):
    @extend_schema(
        tags=["escalations"],
        summary="Reject a request (manager, never your own)",
        request=DecisionIn,
        responses={200: EscalationOut, **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = DecisionIn(data=request.data)
        body.is_valid(raise_exception=True)
        escalation = reject_escalation(
            signed_in(request),
            pk,
            note=body.validated_data.get("note", ""),
            context=audit_context(request),
        )
        return Response(escalation_payload(escalation))
