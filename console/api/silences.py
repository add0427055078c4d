"""Silences (maintenance windows): list them (members), create and end them (managers)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.params import id_param
from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from incidents.models import Silence
from incidents.silences import create_silence, end_silence, visible_silences


class SilenceIn(serializers.Serializer):
    team_id = serializers.IntegerField()
    job_id = serializers.IntegerField(required=False, allow_null=True, help_text="Blank: all jobs.")
    rule_key = serializers.CharField(
        required=False, allow_blank=True, max_length=100, help_text="Blank: every rule."
    )
    starts_at = serializers.DateTimeField(required=False, help_text="Default: now.")
    ends_at = serializers.DateTimeField(help_text="At most 14 days after the start.")
    reason = serializers.CharField(max_length=1000)


class SilenceOut(serializers.Serializer):
    id = serializers.IntegerField()
    team_id = serializers.IntegerField()
    job_id = serializers.IntegerField(allow_null=True)
    rule_key = serializers.CharField()
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
    reason = serializers.CharField()
    created_by = serializers.CharField(allow_null=True)
    ended_by = serializers.CharField(allow_null=True)
    active = serializers.BooleanField(help_text="In force now.")


def silence_out(silence: Silence, now: Any = None) -> dict[str, Any]:
    from django.utils import timezone

    now = now or timezone.now()
    return {
        "id": silence.pk,
        "team_id": silence.team_id,
        "job_id": silence.job_id,
        "rule_key": silence.rule_key,
        "starts_at": silence.starts_at.isoformat(),
        "ends_at": silence.ends_at.isoformat(),
        "reason": silence.reason,
        "created_by": silence.created_by.get_username() if silence.created_by else None,
        "ended_by": silence.ended_by.get_username() if silence.ended_by else None,
        "active": silence.starts_at <= now < silence.ends_at,
    }


class SilenceListView(PersonView):
    @extend_schema(
        tags=["silences"],
        summary="Silences of my teams, newest first (members)",
        parameters=[OpenApiParameter("team", OpenApiTypes.INT)],
        responses={200: SilenceOut(many=True), **error_responses(400, 401, 404)},
    )
    def get(self, request: Request) -> Response:
        team = id_param(request, "team")
        silences = visible_silences(signed_in(request), team_id=team)
        return Response([silence_out(s) for s in silences[:200]])

    @extend_schema(
        tags=["silences"],
        summary="Silence a team's pages, of one job or rule, until a time (manager and above)",
        description="Silenced alerts are still raised, braked, recorded and shown; only their "
        "pages wait until the silence is over.",
        request=SilenceIn,
        responses={201: SilenceOut, **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request) -> Response:
        body = SilenceIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        silence = create_silence(
            signed_in(request),
            data["team_id"],
            job_id=data.get("job_id"),
            rule_key=data.get("rule_key", ""),
            starts_at=data.get("starts_at"),
            ends_at=data["ends_at"],
            reason=data["reason"],
            context=audit_context(request),
        )
        return Response(silence_out(silence), status=201)


class EndSilenceView(PersonView):
    @extend_schema(
        tags=["silences"],
        summary="End a silence now (manager and above)",
        request=None,
        responses={200: SilenceOut, **error_responses(401, 403, 404)},
    )
    def post(self, request: Request, pk: int) -> Response:
        silence = end_silence(signed_in(request), pk, context=audit_context(request))
        return Response(silence_out(silence))
