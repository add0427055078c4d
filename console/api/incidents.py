"""A person's actions on an incident: acknowledge it (every firing alert at once), assign it,
write on its notes thread. Thin: validate the body, call the one service of the verb."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from console.api.alerts import AcknowledgeIn, AlertOut
from console.api.person_auth import PersonView, audit_context, error_responses, signed_in
from incidents.alerts import ownership
from incidents.alerts.acknowledge import acknowledge_incident
from incidents.alerts.lifecycle import alert_payload
from incidents.models import Incident, TimelineEntry
from incidents.teams.access import scoped_get

ERRORS = error_responses(400, 401, 403, 404, 409)


class AcknowledgedOut(serializers.Serializer):
    acknowledged = AlertOut(many=True)


class AssignIn(serializers.Serializer):
    user_id = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="The team member who handles it (on-call and above); omitted: yourself.",
    )


class AssignedOut(serializers.Serializer):
    id = serializers.IntegerField()
    assignee = serializers.CharField(allow_null=True)
    assignee_id = serializers.IntegerField(allow_null=True)
    assigned_at = serializers.DateTimeField(allow_null=True)


class NoteIn(serializers.Serializer):
    text = serializers.CharField(max_length=ownership.MAX_NOTE)


class NoteOut(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    author = serializers.CharField()
    text = serializers.CharField()


def note_out(entry: TimelineEntry) -> dict[str, Any]:
    author = entry.actor.get_username() if entry.actor else entry.actor_kind
    return {"id": entry.pk, "at": entry.at.isoformat(), "author": author, "text": entry.message}


def assigned_out(incident: Incident) -> dict[str, Any]:
    assignee = incident.assignee
    return {
        "id": incident.pk,
        "assignee": assignee.get_username() if assignee is not None else None,
        "assignee_id": incident.assignee_id,
        "assigned_at": incident.assigned_at.isoformat() if incident.assigned_at else None,
    }


class AcknowledgeIncidentView(PersonView):
    @extend_schema(
        tags=["incidents"],
        summary="Acknowledge the incident: every firing alert of it at once (on-call and above)",
        description="One timeline row per alert acknowledged; alerts someone else acknowledged "
        "meanwhile are left alone. 409 when none was firing.",
        request=AcknowledgeIn,
        responses={200: AcknowledgedOut, **ERRORS},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = AcknowledgeIn(data=request.data)
        body.is_valid(raise_exception=True)
        alerts = acknowledge_incident(
            signed_in(request),
            pk,
            note=body.validated_data.get("note", ""),
            context=audit_context(request),
        )
        return Response({"acknowledged": [alert_payload(a) for a in alerts]})


class AssignIncidentView(PersonView):
    @extend_schema(
        tags=["incidents"],
        summary="Take the incident, or assign it to a team member (on-call and above)",
        request=AssignIn,
        responses={200: AssignedOut, **ERRORS},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = AssignIn(data=request.data)
        body.is_valid(raise_exception=True)
        incident = ownership.assign_incident(
            signed_in(request),
            pk,
            assignee_id=body.validated_data.get("user_id"),
            context=audit_context(request),
        )
        return Response(assigned_out(incident))


class NotesView(PersonView):
    @extend_schema(
        tags=["incidents"],
        summary="The incident's notes thread, oldest first",
        responses={200: NoteOut(many=True), **error_responses(401, 404)},
    )
    def get(self, request: Request, pk: int) -> Response:
        incident = scoped_get(
            Incident.objects, request.user, pk, team_path="job__team_id", noun="incident"
        )
        return Response([note_out(e) for e in ownership.notes(incident.pk)])

    @extend_schema(
        tags=["incidents"],
        summary="Write a note on the incident (on-call and above; on its timeline and review)",
        request=NoteIn,
        responses={201: NoteOut, **ERRORS},
    )
    def post(self, request: Request, pk: int) -> Response:
        body = NoteIn(data=request.data)
        body.is_valid(raise_exception=True)
        entry = ownership.add_note(
            signed_in(request), pk, text=body.validated_data["text"], context=audit_context(request)
        )
        return Response(note_out(entry), status=201)
