"""The audit trail of the teams where I am manager or admin (reading it is audited too)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.alerts import LIMIT_PARAMETER, limit_param
from console.api.params import id_param
from console.api.person_auth import PersonView, audit_context, error_responses
from core.errors import Forbidden, InvalidInput
from incidents.models import AuditEntry, Membership, Team
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import READ_AUDIT, audit_read_refusal, audited


class AuditEntryOut(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    user = serializers.CharField(allow_null=True, help_text="None: the system.")
    actor_kind = serializers.CharField()
    team_id = serializers.IntegerField(allow_null=True)
    role = serializers.CharField()
    action = serializers.CharField()
    target_type = serializers.CharField()
    target_id = serializers.IntegerField(allow_null=True)
    level = serializers.CharField()
    allowed = serializers.BooleanField()
    reason = serializers.CharField()
    outcome_code = serializers.CharField(help_text='"ok", or the error code of the answer.')
    outcome = serializers.CharField()
    remote_addr = serializers.CharField(allow_null=True)
    user_agent = serializers.CharField()
    via = serializers.CharField()


def entry_out(entry: AuditEntry) -> dict[str, Any]:
    return {
        "id": entry.pk,
        "at": entry.at.isoformat(),
        "user": entry.user.get_username() if entry.user is not None else None,
        "actor_kind": entry.actor_kind,
        "team_id": entry.team_id,
        "role": entry.role,
        "action": entry.action,
        "target_type": entry.target_type,
        "target_id": entry.target_id,
        "level": entry.level,
        "allowed": entry.allowed,
        "reason": entry.reason,
        "outcome_code": entry.outcome_code,
        "outcome": entry.outcome,
        "remote_addr": entry.remote_addr,
        "user_agent": entry.user_agent,
        "via": entry.via,
    }


def _readable_team_ids(user: Any, team: int | None, request: Request) -> list[int]:
    if team is None:
        memberships = Membership.objects.filter(user=user).values_list("team_id", "role")
        return [team_id for team_id, role in memberships if audit_read_refusal(role) is None]
    with audited(user, READ_AUDIT, "team", team, audit_context(request)) as attempt:
        found = scoped_get(Team.objects, user, team, team_path="id", noun="team")
        attempt.team_id, attempt.role = found.pk, role_in_team(user, found.pk)
        refusal = audit_read_refusal(attempt.role)
        attempt.allowed, attempt.reason = refusal is None, refusal or "A manager or above."
        if refusal is not None:
            raise Forbidden(refusal)
        attempt.succeeded("audit trail read")
    return [found.pk]


class AuditListView(PersonView):
    @extend_schema(
        tags=["audit"],
        summary="Audit trail (every attempt, allowed or refused) of my teams, newest first",
        description="Only teams where you are manager or admin; `?team=` another role is 403, "
        "a team you are not in is 404. Reading one team's trail is itself audited.",
        parameters=[
            OpenApiParameter("team", OpenApiTypes.INT),
            OpenApiParameter("allowed", OpenApiTypes.BOOL),
            LIMIT_PARAMETER,
        ],
        responses={200: AuditEntryOut(many=True), **error_responses(400, 401, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        team_ids = _readable_team_ids(request.user, id_param(request, "team"), request)
        entries = AuditEntry.objects.filter(team_id__in=team_ids).select_related("user")
        allowed = request.query_params.get("allowed")
        if allowed is not None:
            if allowed not in ("true", "false"):
                raise InvalidInput("Bad allowed.", fields={"allowed": "true or false"})
            entries = entries.filter(allowed=allowed == "true")
        return Response([entry_out(e) for e in entries[: limit_param(request)]])
