"""On-call rotations and shifts of a team: who is on call, from when to when, and who next
(managers arrange them)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.params import parse_moment
from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from incidents.models import OnCallRotation, OnCallShift, Team
from incidents.teams.access import scoped_get
from incidents.teams.oncall import (
    create_rotation,
    create_shift,
    delete_rotation,
    delete_shift,
    on_call_summary,
    team_shifts,
)


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


class NextOut(serializers.Serializer):
    at = serializers.DateTimeField()
    people = PersonOut(many=True)


class OnCallOut(serializers.Serializer):
    at = serializers.DateTimeField()
    people = PersonOut(
        many=True, help_text="Shifts (overrides) first, latest start first; then the rotations."
    )
    next = NextOut(allow_null=True, help_text="When the people on call change next, and to whom.")


class RotationIn(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    people = serializers.ListField(
        child=serializers.IntegerField(), max_length=50, help_text="User ids, in turn order."
    )
    length_days = serializers.IntegerField(help_text="Days per turn (7: weekly).")
    handoff_time = serializers.TimeField(help_text="Wall-clock hand-off time in time_zone.")
    time_zone = serializers.CharField(max_length=64, help_text="IANA, e.g. Europe/Paris.")
    starts_on = serializers.DateField(help_text="The first person's turn begins that day.")


class RotationOut(RotationIn):
    id = serializers.IntegerField()
    team_id = serializers.IntegerField()


def rotation_out(row: OnCallRotation) -> dict[str, Any]:
    return {
        "id": row.pk,
        "team_id": row.team_id,
        "name": row.name,
        "people": list(row.people),
        "length_days": row.length_days,
        "handoff_time": row.handoff_time.strftime("%H:%M:%S"),
        "time_zone": row.time_zone,
        "starts_on": row.starts_on.isoformat(),
    }


def _people(people: list[Any]) -> list[dict[str, Any]]:
    return [{"id": p.pk, "username": p.get_username()} for p in people]


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
            signed_in(request),
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
        delete_shift(signed_in(request), pk, shift_id, context=audit_context(request))
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
        summary = on_call_summary(team, at)
        following = (
            {"at": summary.next_at.isoformat(), "people": _people(summary.next)}
            if summary.next_at is not None
            else None
        )
        return Response({"at": at.isoformat(), "people": _people(summary.now), "next": following})


class RotationListView(PersonView):
    @extend_schema(
        tags=["on-call"],
        summary="The team's rotations (members)",
        responses={200: RotationOut(many=True), **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        team = _my_team(request, pk)
        return Response([rotation_out(r) for r in OnCallRotation.objects.filter(team=team)])

    @extend_schema(
        tags=["on-call"],
        summary="Add a rotation (manager and above)",
        request=RotationIn,
        responses={201: RotationOut, **error_responses(400, 401, 403, 404, 409)},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = RotationIn(data=request.data)
        body.is_valid(raise_exception=True)
        row = create_rotation(
            signed_in(request), pk, **body.validated_data, context=audit_context(request)
        )
        return Response(rotation_out(row), status=201)


class RotationDetailView(PersonView):
    @extend_schema(
        tags=["on-call"],
        summary="Remove a rotation (manager and above)",
        responses={204: None, **error_responses(401, 403, 404)},
    )
    def delete(self, request: Request, pk: int, rotation_id: int) -> Response:
        delete_rotation(signed_in(request), pk, rotation_id, context=audit_context(request))
        return Response(status=204)
