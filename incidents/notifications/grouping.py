"""Grouping: an alert storm (one rule firing on many nodes of one job) pages once per
incident and level, not once per node.

The first alert of an incident to reach a level gets the round that pages (the group's
"leader"); every later alert of that incident at that level is recorded on the timeline as
grouped with it and pages nobody, while the leader is still open (firing or acknowledged).
Acknowledging the leader therefore answers the whole storm. A leader that resolves on its own
hands the group over: the next alert of that level pages again.
"""

from __future__ import annotations

from datetime import datetime

from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    ACTIVE_ALERT_STATUSES,
    Alert,
    Incident,
    NotificationRound,
    RoundStatus,
    TimelineEntry,
    TimelineKind,
)

# A brake whose checkpoint failed is news to whoever was paged for the anomaly it answered:
# the state they count on does not exist. Its alert pages on its own, never grouped.
FAILED_BRAKE_RULE = "brake-checkpoint-failed"
PAGES_ALONE = frozenset({FAILED_BRAKE_RULE})


def page_leader(alert: Alert) -> Alert | None:
    """The open alert that already pages for ``alert``'s incident and level, or None.

    Call inside the transaction that creates the alert's first round: the incident's row lock
    makes two alerts of one storm, dispatched by two workers at once, see each other (the
    second waits, then finds the first one's round)."""
    if alert.incident_id is None or alert.rule_key in PAGES_ALONE:
        return None
    Incident.objects.select_for_update(no_key=True).filter(pk=alert.incident_id).values_list(
        "pk"
    ).first()
    leading = (
        NotificationRound.objects.filter(
            alert__incident_id=alert.incident_id,
            severity=alert.severity,
            number=0,
            status__in=[RoundStatus.SCHEDULED, RoundStatus.FIRED],
            alert__status__in=ACTIVE_ALERT_STATUSES,
        )
        .exclude(alert_id=alert.pk)
        .select_related("alert")
        .order_by("id")
        .first()
    )
    return leading.alert if leading is not None else None


def record_grouped(alert: Alert, leader: Alert, now: datetime) -> None:
    """The timeline's note that ``alert`` pages nobody of its own (once per alert and level)."""
    if alert.incident_id is None:
        return
    data = {"notification": "grouped", "leader_alert_id": leader.pk, "severity": alert.severity}
    noted = TimelineEntry.objects.filter(alert_id=alert.pk, kind=TimelineKind.NOTE)
    if noted.filter(data__notification="grouped", data__severity=alert.severity).exists():
        return  # a redelivered dispatch task
    where = f" on {alert.node}" if alert.node else ""
    append_timeline(
        alert.incident_id,
        TimelineKind.NOTE,
        f"{alert.severity} {alert.rule_name}{where}: not paged separately, grouped with alert "
        f"#{leader.pk} ({leader.rule_name}{' on ' + leader.node if leader.node else ''}), "
        f"which already pages for {alert.severity} in this incident",
        at=now,
        alert_id=alert.pk,
        step=alert.step,
        data=data,
    )
