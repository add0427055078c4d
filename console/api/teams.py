"""On-call shifts of a team: who is on call, from when to when (managers arrange them)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.params import parse_moment
from console.api.person_auth import PersonView, audit_context, error_responses
from incidents.models import OnCallShift, Team
from incidents.teams.access import scoped_get
from incidents.teams.oncall import create_shift, delete_shift, team_shifts, who_is_on_call


class ShiftIn(serializers.Serializer):
    user_id = serializers.IntegerField(help_text="A member of the team, on-call or above.")
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()


class ShiftOut(serializers.Serializer):
    id = serializers.IntegerField()
    team_id = serializers.IntegerField()
    user_id = serializers.IntegerField()
    username = serializers.CharField()
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()


class PersonOut(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()


class OnCallOut(serializers.Serializer):
    at = serializers.DateTimeField()
    people = PersonOut(many=True, help_text="Most recent shift first: paged first.")


def shift_out(shift: OnCallShift) -> dict[str, Any]:
    return {
        "id": shift.pk,
        "team_id": shift.team_id,
        "user_id": shift.user_id,
        "username": shift.user.get_username(),
        "starts_at": shift.starts_at.isoformat(),
        "ends_at": shift.ends_at.isoformat(),
    }


def _my_team(request: Request, pk: int) -> Team:
    return scoped_get(Team.objects, request.user, pk, team_path="id", noun="team")


def _time_param(request: Request, name: str) -> Any:
    raw = request.query_params.get(name)
    return None if raw is None else parse_moment(raw, name, dates=False)


class ShiftListView(PersonView):
    @extend_schema(
        tags=["on-call"],
        summary="The team's shifts (members)",
        parameters=[
            OpenApiParameter(
                "ending_after",
                OpenApiTypes.DATETIME,
                description="Only shifts "
                "that end after this time (e.g. now: current and future ones).",
            )
        ],
        responses={200: ShiftOut(many=True), **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        team = _my_team(request, pk)
        shifts = team_shifts(team, ending_after=_time_param(request, "ending_after"))
        return Response([shift_out(s) for s in shifts])

    @extend_schema(
        tags=["on-call"],
        summary="Put a member on call (manager and above)",
        request=ShiftIn,
        responses={201: ShiftOut, **error_responses(400, 401, 403, 404)},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = ShiftIn(data=request.data)
        body.is_valid(raise_exception=True)
        shift = create_shift(
            request.user,
            pk,
            person_id=body.validated_data["user_id"],
            starts_at=body.validated_data["starts_at"],
            ends_at=body.validated_data["ends_at"],
            context=audit_context(request),
        )
        return Response(shift_out(shift), status=201)


class ShiftDetailView(PersonView):
    @extend_schema(
        tags=["on-call"],
        summary="Remove a shift (manager and above)",
        responses={204: None, **error_responses(401, 403, 404)},
    )
    def delete(self, request: Request, pk: int, shift_id: int) -> Response:
        delete_shift(request.user, pk, shift_id, context=audit_context(request))
        return Response(status=204)


class OnCallNowView(PersonView):
    @extend_schema(
        tags=["on-call"],
        summary="Who is on call for the team (now, or at ?at=)",
        parameters=[OpenApiParameter("at", OpenApiTypes.DATETIME)],
        responses={200: OnCallOut, **error_responses(400, 401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        team = _my_team(request, pk)
        at = _time_param(request, "at") or timezone.now()
        people = who_is_on_call(team, at)
        return Response(
            {
                "at": at.isoformat(),
                "people": [{"id": p.pk, "username": p.get_username()} for p in people],
            }
        )
