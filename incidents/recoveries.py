"""A person takes an incident over from automatic recovery (docs/recovery.md).

Taking over is a click ("Take over" on the incident page, ``POST /api/v1/incidents/<id>/
take-over``), and so is any command a person sends to the job meanwhile (pause, resume,
confirm, terminate…: ``breakers.control.commands`` calls ``stop_automatic_recovery``). Either
way the incident remembers who, its open automatic recovery stops where it is (a roll back
already on its way to the job is not recalled: the job's answer is recorded as for any
command), and every later brake of the incident holds for a person.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from core.realtime import job_group, publish_after_commit
from core.transitions import compare_and_swap_all
from incidents.alerts.lifecycle import append_timeline
from incidents.alerts.ownership import authorised_incident
from incidents.models import (
    OPEN_RECOVERY_STATUSES,
    RECOVERY_TRANSITIONS,
    ActorKind,
    Incident,
    Recovery,
    RecoveryStatus,
    TimelineKind,
)
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action
from incidents.teams.users import User

TAKEN_OVER_EVENT = "recovery_taken_over"


def stop_automatic_recovery(incident_id: int, user: Any, why: str) -> bool:
    """Inside the caller's transaction: the incident is the person's from now on. True when
    this call took it over (False: somebody had already)."""
    now = timezone.now()
    took = Incident.objects.filter(pk=incident_id, taken_over_by__isnull=True).update(
        taken_over_by=user, taken_over_at=now
    )
    if not took:
        return False
    stopped = compare_and_swap_all(
        Recovery.objects.filter(incident_id=incident_id),
        table=RECOVERY_TRANSITIONS,
        expected=OPEN_RECOVERY_STATUSES,
        new=RecoveryStatus.TAKEN_OVER,
        taken_over_by=user,
        finished_at=now,
    )
    text = f"Taken over from automatic recovery by {user}: {why}"
    if stopped:
        text += " (the automatic recovery under way stops here)"
    append_timeline(
        incident_id,
        TimelineKind.NOTE,
        text,
        at=now,
        actor_kind=ActorKind.PERSON,
        actor=user,
        data={"event": TAKEN_OVER_EVENT, "stopped": stopped},
    )
    job_id = Incident.objects.values_list("job_id", flat=True).get(pk=incident_id)
    publish_after_commit(
        job_group(job_id), {"type": "incident.updated", "incident_id": incident_id}
    )
    return True


def take_over(user: User, incident_id: int, *, context: AuditContext | None = None) -> Incident:
    """The "Take over" button: whoever may take the incident may take it from the machine.
    Taking over an incident already taken over changes nothing."""
    with audited(user, Action.ASSIGN_INCIDENT, "incident", incident_id, context) as attempt:
        incident = authorised_incident(user, incident_id, Action.ASSIGN_INCIDENT, attempt)
        with transaction.atomic():
            took = stop_automatic_recovery(incident.pk, user, "the Take over button")
            incident.refresh_from_db()
            attempt.succeeded(
                f"incident #{incident.pk}: "
                + ("taken over from automatic recovery" if took else "already taken over")
            )
    return incident


def recoveries(incident_id: int) -> list[Recovery]:
    """The incident's verdicts, oldest first (the incident page and the review)."""
    return list(Recovery.objects.filter(incident_id=incident_id).select_related("taken_over_by"))
