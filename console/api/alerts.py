"""Alerts of my teams, acknowledging one, snoozing one's pages."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.params import id_param, int_param
from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from core.errors import InvalidInput
from incidents.alerts.acknowledge import acknowledge_alert
from incidents.alerts.lifecycle import alert_payload
from incidents.alerts.snooze import snooze_alert
from incidents.models import Alert, AlertStatus, Severity
from incidents.teams.access import scoped_get, visible_team_ids

MAX_LIMIT = 500


class AlertOut(serializers.Serializer):
    """What docs/design.md "What an alert must carry" lists
    (``incidents.alerts.lifecycle.alert_payload``)."""

    id = serializers.IntegerField()
    incident_id = serializers.IntegerField(allow_null=True)
    status = serializers.ChoiceField(choices=AlertStatus.choices)
    severity = serializers.ChoiceField(choices=Severity.choices)
    layer = serializers.CharField()
    job = serializers.DictField()
    node = serializers.CharField(allow_null=True)
    nodes = serializers.ListField(child=serializers.CharField())
    rule = serializers.DictField()
    metric = serializers.CharField()
    value = serializers.JSONField()
    threshold = serializers.JSONField()
    duration_seconds = serializers.FloatField()
    duration_steps = serializers.IntegerField()
    first_step = serializers.IntegerField()
    first_time = serializers.DateTimeField()
    step = serializers.IntegerField()
    raised_at = serializers.DateTimeField()
    description = serializers.CharField()
    action = serializers.CharField()
    action_params = serializers.DictField()
    runbook = serializers.DictField()
    snoozed_until = serializers.DateTimeField(
        allow_null=True, help_text="Its pages wait until then (a snooze); never its brakes."
    )


class AcknowledgeIn(serializers.Serializer):
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000)


LIMIT_PARAMETER = OpenApiParameter(
    "limit",
    {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
    description="How many rows at most (default 100).",
)


def limit_param(request: Request, default: int = 100) -> int:
    return int_param(request, "limit", minimum=1, maximum=MAX_LIMIT, default=default)


def visible_alerts(user: Any) -> QuerySet[Alert]:
    """Alerts of the user's teams, newest first."""
    return (
        Alert.objects.filter(job__team_id__in=visible_team_ids(user))
        .select_related("job")
        .order_by("-raised_at", "-id")
    )


class AlertListView(PersonView):
    @extend_schema(
        tags=["alerts"],
        summary="Alerts of my teams, newest first",
        parameters=[
            OpenApiParameter(
                "status",
                OpenApiTypes.STR,
                description="firing, acknowledged, resolved; comma-separated",
            ),
            OpenApiParameter("job", OpenApiTypes.INT),
            LIMIT_PARAMETER,
        ],
        responses={200: AlertOut(many=True), **error_responses(400, 401)},
    )
    def get(self, request: Request) -> Response:
        alerts = visible_alerts(request.user)
        statuses = [s for s in request.query_params.get("status", "").split(",") if s]
        if set(statuses) - set(AlertStatus.values):
            raise InvalidInput("Bad status.", fields={"status": ", ".join(AlertStatus.values)})
        if statuses:
            alerts = alerts.filter(status__in=statuses)
        job = id_param(request, "job")
        if job is not None:
            alerts = alerts.filter(job_id=job)
        return Response([alert_payload(a) for a in alerts[: limit_param(request)]])


class AlertDetailView(PersonView):
    @extend_schema(
        tags=["alerts"],
        summary="One alert of my teams",
        responses={200: AlertOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        alert = scoped_get(
            Alert.objects.select_related("job"),
            request.user,
            pk,
            team_path="job__team_id",
            noun="alert",
        )
        return Response(alert_payload(alert))


class AcknowledgeAlertView(PersonView):
    @extend_schema(
        tags=["alerts"],
        summary="Acknowledge a firing alert (on-call and above)",
        description="Stops the alert's escalation to the next person. 409 when it is already "
        "acknowledged (by whom) or resolved.",
        request=AcknowledgeIn,
        responses={200: AlertOut, **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = AcknowledgeIn(data=request.data)
        body.is_valid(raise_exception=True)
        alert = acknowledge_alert(
            signed_in(request),
            pk,
            note=body.validated_data.get("note", ""),
            context=audit_context(request),
        )
        return Response(alert_payload(alert))


class SnoozeIn(serializers.Serializer):
    minutes = serializers.IntegerField(
        min_value=1, max_value=240, help_text="How long its pages wait: 1 to 240 minutes."
    )


class SnoozeAlertView(PersonView):
    @extend_schema(
        tags=["alerts"],
        summary="Snooze a firing alert's pages for up to 4 hours (on-call and above)",
        description="Pages only: the alert stays firing and shown, and the automatic L3/L4 "
        "actions still fire. A second snooze replaces the first, from now. 409 unless firing.",
        request=SnoozeIn,
        responses={200: AlertOut, **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = SnoozeIn(data=request.data)
        body.is_valid(raise_exception=True)
        alert = snooze_alert(
            signed_in(request),
            pk,
            minutes=body.validated_data["minutes"],
            context=audit_context(request),
        )
        return Response(alert_payload(alert))
