"""A person acknowledging an alert: firing → acknowledged, on the timeline, audited."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from core.errors import Conflict
from core.realtime import job_group, publish_after_commit, team_group
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import alert_payload, append_timeline
from incidents.models import (
    ALERT_TRANSITIONS,
    ActorKind,
    Alert,
    AlertStatus,
    TimelineEntry,
    TimelineKind,
)
from incidents.notifications.delivery import stop_notifications
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User


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
        now = timezone.now()
        with transaction.atomic():
            won = compare_and_swap(
                Alert,
                alert.pk,
                table=ALERT_TRANSITIONS,
                expected=[AlertStatus.FIRING],
                new=AlertStatus.ACKNOWLEDGED,
                acknowledged_at=now,
            )
            if not won:
                raise Conflict(_why_not_firing(alert.pk))
            alert.refresh_from_db()
            _record_acknowledgement(alert, user, note.strip(), now)
            # Same transaction: the ack and the end of its paging commit together, so no
            # escalation round or queued call can slip out after someone has answered.
            stop_notifications(alert.pk)
            attempt.succeeded(f"alert #{alert.pk} acknowledged")
    return alert


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
