"""A person acknowledging an alert, or every firing alert of an incident at once: firing →
acknowledged, on the timeline, audited."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, InvalidInput
from core.realtime import job_group, publish_after_commit, team_group
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import alert_payload, append_timeline
from incidents.models import (
    ALERT_TRANSITIONS,
    ActorKind,
    Alert,
    AlertStatus,
    Incident,
    TimelineEntry,
    TimelineKind,
)
from incidents.notifications.delivery import stop_notifications
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User

MAX_NOTE = 2000


def acknowledge_alert(
    user: User, alert_id: int, *, note: str = "", context: AuditContext | None = None
) -> Alert:
    """firing → acknowledged by ``user``: the alert's escalation to the manager stops here.

    409 when it is already acknowledged (saying by whom) or resolved; the loser of two
    simultaneous acknowledgements gets the same 409.
    """
    with audited(user, Action.ACKNOWLEDGE_ALERT, "alert", alert_id, context) as attempt:
        alert = scoped_get(
            Alert.objects.select_related("job"),
            user,
            alert_id,
            team_path="job__team_id",
            noun="alert",
            attempt=attempt,
        )
        role = role_in_team(user, alert.job.team_id)
        attempt.check(decide(role, Action.ACKNOWLEDGE_ALERT, alert.severity))
        with transaction.atomic():
            if not _acknowledge_one(alert, user, note.strip(), timezone.now()):
                raise Conflict(_why_not_firing(alert.pk))
            attempt.succeeded(f"alert #{alert.pk} acknowledged")
    return alert


def acknowledge_incident(
    user: User, incident_id: int, *, note: str = "", context: AuditContext | None = None
) -> list[Alert]:
    """Every firing alert of the incident → acknowledged by ``user``, in one transaction.

    One NaN raises several alerts (the value and the step guard); on-call answers the incident
    once. The authority is asked at each alert's level, as for one acknowledgement; each alert
    gets its own ``acknowledged`` timeline row, so the review measures every alert's time to
    acknowledge. An alert someone else acknowledged meanwhile is left to them; 409 when none
    was firing."""
    with audited(user, Action.ACKNOWLEDGE_ALERT, "incident", incident_id, context) as attempt:
        incident = scoped_get(
            Incident.objects.select_related("job"),
            user,
            incident_id,
            team_path="job__team_id",
            noun="incident",
            attempt=attempt,
        )
        role = role_in_team(user, incident.job.team_id)
        firing = list(
            incident.alerts.filter(status=AlertStatus.FIRING)
            .select_related("job")
            .order_by("-severity", "pk")
        )
        levels: list[str | None] = [*sorted({a.severity for a in firing})]
        for level in levels or [None]:
            attempt.check(decide(role, Action.ACKNOWLEDGE_ALERT, level))
        if len(note) > MAX_NOTE:
            raise InvalidInput("The note is too long.", fields={"note": "at most 2000 characters"})
        now = timezone.now()
        with transaction.atomic():
            done = [a for a in firing if _acknowledge_one(a, user, note.strip(), now)]
            if not done:
                raise Conflict(f"Incident #{incident.pk} has no firing alert to acknowledge.")
            ids = ", ".join(f"#{a.pk}" for a in done)
            attempt.succeeded(f"incident #{incident.pk}: alerts {ids} acknowledged")
    return done


def _acknowledge_one(alert: Alert, user: User, note: str, now: datetime) -> bool:
    """firing → acknowledged as a compare-and-swap, with its timeline row and the end of its
    paging; False (nothing written) when it was no longer firing. Call in a transaction."""
    won = compare_and_swap(
        Alert,
        alert.pk,
        table=ALERT_TRANSITIONS,
        expected=[AlertStatus.FIRING],
        new=AlertStatus.ACKNOWLEDGED,
        acknowledged_at=now,
    )
    if not won:
        return False
    alert.refresh_from_db()
    _record_acknowledgement(alert, user, note, now)
    # Same transaction: the ack and the end of its paging commit together, so no escalation
    # round or queued call can slip out after someone has answered.
    stop_notifications(alert.pk)
    return True


def _record_acknowledgement(alert: Alert, user: User, note: str, now: datetime) -> None:
    """The timeline row (an alert with an incident), and the console is told after commit."""
    if alert.incident_id is not None:
        append_timeline(
            alert.incident_id,
            TimelineKind.ACKNOWLEDGED,
            f"{alert.severity} {alert.rule_name} acknowledged by {user}"
            + (f": {note}" if note else ""),
            at=now,
            alert_id=alert.pk,
            step=alert.step,
            actor_kind=ActorKind.PERSON,
            actor=user,
            data={"alert_id": alert.pk, "note": note},
        )
    payload = {"type": "alert.acknowledged", "alert": alert_payload(alert)}
    publish_after_commit(job_group(alert.job_id), payload)
    publish_after_commit(team_group(alert.job.team_id), payload)


def _why_not_firing(alert_id: int) -> str:
    alert = Alert.objects.get(pk=alert_id)
    if alert.status == AlertStatus.RESOLVED:
        return f"Alert {alert_id} is already resolved."
    row = (
        TimelineEntry.objects.filter(alert_id=alert_id, kind=TimelineKind.ACKNOWLEDGED)
        .select_related("actor")
        .first()
    )
    who = f" by {row.actor}" if row is not None and row.actor is not None else ""
    return f"Alert {alert_id} was already acknowledged{who}."
