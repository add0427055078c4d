"""An incident's automatic recoveries: their verdicts with reasons, and a person's taking the
incident over from them (``incidents.recoveries.take_over``; docs/recovery.md)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from incidents import recoveries
from incidents.models import Incident, Recovery
from incidents.teams.access import scoped_get


class RecoveryOut(serializers.Serializer):
    id = serializers.IntegerField()
    pause_command_id = serializers.IntegerField()
    rule_key = serializers.CharField()
    cause = serializers.CharField()
    window = serializers.ListField(child=serializers.IntegerField())
    rank = serializers.IntegerField(allow_null=True)
    node = serializers.CharField()
    verdict = serializers.CharField()
    reasons = serializers.ListField(child=serializers.CharField())
    status = serializers.CharField()
    decided_at = serializers.DateTimeField()
    checkpoint_step = serializers.IntegerField(allow_null=True)
    skip_steps = serializers.ListField(child=serializers.IntegerField())
    resume_command_id = serializers.IntegerField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class RecoveriesOut(serializers.Serializer):
    taken_over_by = serializers.CharField(allow_null=True)
    taken_over_at = serializers.DateTimeField(allow_null=True)
    recoveries = RecoveryOut(many=True)


def recovery_out(row: Recovery) -> dict[str, Any]:
    return {
        "id": row.pk,
        "pause_command_id": row.pause_command_id,
        "rule_key": row.rule_key,
        "cause": row.cause,
        "window": [row.first_step, row.last_step],
        "rank": row.rank,
        "node": row.node,
        "verdict": row.verdict,
        "reasons": list(row.reasons),
        "status": row.status,
        "decided_at": row.decided_at.isoformat(),
        "checkpoint_step": row.checkpoint_step,
        "skip_steps": list(row.skip_steps),
        "resume_command_id": row.resume_command_id,
        "finished_at": row.finished_at.isoformat() if row.finished_at else None,
    }


def recoveries_out(incident: Incident) -> dict[str, Any]:
    who = incident.taken_over_by
    return {
        "taken_over_by": who.get_username() if who is not None else None,
        "taken_over_at": incident.taken_over_at.isoformat() if incident.taken_over_at else None,
        "recoveries": [recovery_out(r) for r in recoveries.recoveries(incident.pk)],
    }


class RecoveriesView(PersonView):
    @extend_schema(
        tags=["incidents"],
        summary="The incident's automatic recovery verdicts, oldest first, and who took over",
        responses={200: RecoveriesOut, **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        incident = scoped_get(
            Incident.objects.select_related("taken_over_by"),
            request.user,
            pk,
            team_path="job__team_id",
            noun="incident",
        )
        return Response(recoveries_out(incident))


class TakeOverView(PersonView):
    @extend_schema(
        tags=["incidents"],
        summary="Take the incident over from automatic recovery (on-call and above)",
        description="The automatic recovery under way stops where it is and every later brake "
        "of the incident holds for a person. Taking over twice changes nothing.",
        request=None,
        responses={200: RecoveriesOut, **error_responses(401, 403, 404)},
    )
    def post(self, request: Request, pk: int) -> Response:
        incident = recoveries.take_over(signed_in(request), pk, context=audit_context(request))
        return Response(recoveries_out(incident))
