"""Who handles an incident, and the notes they write on it.

An incident has one assignee (taken by on-call, or handed to another member who may act on it);
the notes are the incident's thread: timestamped, signed, append-only rows of its timeline, so
they show on the incident page, in the review and in its exports without a second copy.
Every change is audited and written on the timeline in the same transaction.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from core.errors import InvalidInput
from core.realtime import job_group, publish_after_commit
from incidents.alerts.lifecycle import append_timeline
from incidents.models import ActorKind, Incident, Membership, TimelineEntry, TimelineKind
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import Attempt, AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User

MAX_NOTE = 4000
NOTE_EVENT = "incident_note"  # a NOTE row's data["event"] when a person wrote it
ASSIGNED_EVENT = "incident_assigned"


def authorised_incident(user: User, incident_id: int, action: Action, attempt: Attempt) -> Incident:
    """The incident (404 unless the user's team's), after the authority's answer (403)."""
    incident = scoped_get(
        Incident.objects.select_related("job", "assignee"),
        user,
        incident_id,
        team_path="job__team_id",
        noun="incident",
        attempt=attempt,
    )
    attempt.check(decide(role_in_team(user, incident.job.team_id), action, incident.level))
    return incident


def _assignable(incident: Incident, user_id: Any) -> User:
    """A member of the incident's team who may act on it (on-call and above), else 400."""
    if isinstance(user_id, bool) or not isinstance(user_id, int):
        raise InvalidInput("Name the assignee by user id.", fields={"user_id": "a user id"})
    membership = (
        Membership.objects.filter(team_id=incident.job.team_id, user_id=user_id)
        .select_related("user")
        .first()
    )
    if membership is None or not decide(membership.role, Action.ASSIGN_INCIDENT).allowed:
        raise InvalidInput(
            "An incident is assigned to an on-call engineer, a manager or an admin of its team.",
            fields={"user_id": "a member of the team who may act (on-call and above)"},
        )
    return membership.user


def assign_incident(
    user: User,
    incident_id: int,
    *,
    assignee_id: int | None = None,
    context: AuditContext | None = None,
) -> Incident:
    """Make ``assignee_id`` (the person themselves when None: "take it") the incident's
    assignee. Handing over from someone else is allowed and said on the timeline."""
    with audited(user, Action.ASSIGN_INCIDENT, "incident", incident_id, context) as attempt:
        incident = authorised_incident(user, incident_id, Action.ASSIGN_INCIDENT, attempt)
        assignee = _assignable(incident, user.pk if assignee_id is None else assignee_id)
        previous = incident.assignee
        now = timezone.now()
        with transaction.atomic():
            Incident.objects.filter(pk=incident.pk).update(assignee=assignee, assigned_at=now)
            incident.refresh_from_db()
            taken = assignee.pk == user.pk
            text = f"Taken by {user}" if taken else f"Assigned to {assignee} by {user}"
            if previous is not None and previous.pk != assignee.pk:
                text += f" (was {previous})"
            append_timeline(
                incident.pk,
                TimelineKind.NOTE,
                text,
                at=now,
                actor_kind=ActorKind.PERSON,
                actor=user,
                data={"event": ASSIGNED_EVENT, "assignee_id": assignee.pk},
            )
            attempt.succeeded(f"incident #{incident.pk}: {text}")
            _tell(incident)
    return incident


def add_note(
    user: User, incident_id: int, *, text: str, context: AuditContext | None = None
) -> TimelineEntry:
    """Append the person's note to the incident's thread (its timeline)."""
    with audited(user, Action.NOTE_INCIDENT, "incident", incident_id, context) as attempt:
        incident = authorised_incident(user, incident_id, Action.NOTE_INCIDENT, attempt)
        text = (text or "").strip()
        if not text or len(text) > MAX_NOTE or "\x00" in text:
            raise InvalidInput(
                "A note is 1 to 4000 characters of text.",
                fields={"text": "1 to 4000 characters"},
            )
        with transaction.atomic():
            entry = append_timeline(
                incident.pk,
                TimelineKind.NOTE,
                text,
                actor_kind=ActorKind.PERSON,
                actor=user,
                data={"event": NOTE_EVENT},
            )
            attempt.succeeded(f"incident #{incident.pk}: note #{entry.pk}")
            _tell(incident)
    return entry


def notes(incident_id: int) -> list[TimelineEntry]:
    """The incident's thread, oldest first."""
    return list(
        TimelineEntry.objects.filter(incident_id=incident_id, data__event=NOTE_EVENT)
        .select_related("actor")
        .order_by("at", "id")
    )


def _tell(incident: Incident) -> None:
    publish_after_commit(
        job_group(incident.job_id), {"type": "incident.updated", "incident_id": incident.pk}
    )
