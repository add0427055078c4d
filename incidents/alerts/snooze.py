"""Snoozing one alert: its pages wait a bounded while; its brakes never do.

On-call, paged at night for an alert they are already looking at, holds its next pages back for
15 minutes, an hour, at most 4 hours, without acknowledging it (an acknowledgement ends the
paging for good). Like a silence, a snooze is consulted only where a notification round is
about to page (``incidents.silences.hold_back``): the evaluation, the alert, its incident and
the automatic L3/L4 command are untouched. Whether an alert is snoozed is a matter of the clock
(``snoozed_until``), so it has no status of its own; each held-back page is a timeline note. A
snooze holds the level it was given at: the alert rising above it pages at once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from core.errors import Conflict, InvalidInput
from core.realtime import job_group, publish_after_commit, team_group
from incidents.alerts.lifecycle import alert_payload, append_timeline
from incidents.models import ActorKind, Alert, AlertStatus, AuditEntry, TimelineKind
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import SYSTEM_CONTEXT, AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User

MAX_SNOOZE = timedelta(hours=4)
# What the alert's card offers: [minutes, label].
SNOOZE_CHOICES = [[15, "15 minutes"], [60, "1 hour"], [240, "4 hours"]]
PAGE_SNOOZED = "page_snoozed"  # the audit action of a held-back page (system, not a person)


def snoozed(alert: Alert, at: datetime | None = None) -> bool:
    """Whether the alert's pages wait at ``at``: snoozed until later, and not risen above the
    level it was snoozed at (an L2 snoozed that turns L3 pages at once)."""
    if alert.snoozed_until is None or alert.snoozed_until <= (at or timezone.now()):
        return False
    return alert.severity <= alert.snoozed_level


def clean_minutes(minutes: object) -> timedelta:
    """A snooze's length: whole minutes from 1 to 240 (4 hours), else 400 naming the field."""
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 240:
        raise InvalidInput(
            "A snooze lasts 1 to 240 minutes (4 hours at most).",
            fields={"minutes": "a whole number of minutes, 1 to 240"},
        )
    return timedelta(minutes=minutes)


def snooze_alert(
    user: User, alert_id: int, *, minutes: int, context: AuditContext | None = None
) -> Alert:
    """Hold the firing alert's pages back for ``minutes`` from now (on-call; audited). A second
    snooze replaces the first, from now: the bound always counts from the last decision."""
    with audited(user, Action.SNOOZE_ALERT, "alert", alert_id, context) as attempt:
        alert = scoped_get(
            Alert.objects.select_related("job"),
            user,
            alert_id,
            team_path="job__team_id",
            noun="alert",
            attempt=attempt,
        )
        attempt.check(
            decide(role_in_team(user, alert.job.team_id), Action.SNOOZE_ALERT, alert.severity)
        )
        length = clean_minutes(minutes)
        now = timezone.now()
        until = now + length
        with transaction.atomic():
            # Only a firing alert pages: an acknowledged one already stopped, a resolved one is
            # over. Conditional, so a concurrent acknowledgement wins cleanly.
            if not Alert.objects.filter(pk=alert.pk, status=AlertStatus.FIRING).update(
                snoozed_until=until, snoozed_by=user, snoozed_level=alert.severity
            ):
                alert.refresh_from_db()
                raise Conflict(f"Alert {alert.pk} is {alert.status}: only a firing alert pages.")
            alert.refresh_from_db()
            _record_snooze(alert, user, now, int(length.total_seconds() // 60))
            attempt.succeeded(f"alert #{alert.pk} snoozed until {until:%Y-%m-%d %H:%M} UTC")
    return alert


def _record_snooze(alert: Alert, user: User, now: datetime, minutes: int) -> None:
    if alert.incident_id is not None:
        append_timeline(
            alert.incident_id,
            TimelineKind.NOTE,
            f"{alert.severity} {alert.rule_name} snoozed by {user} for {minutes} min (pages "
            f"only, until {alert.snoozed_until:%H:%M} UTC; the brakes still act)",
            at=now,
            alert_id=alert.pk,
            step=alert.step,
            actor_kind=ActorKind.PERSON,
            actor=user,
            data={"event": "alert_snoozed", "minutes": minutes},
        )
    payload = {"type": "alert.snoozed", "alert": alert_payload(alert)}
    publish_after_commit(job_group(alert.job_id), payload)
    publish_after_commit(team_group(alert.job.team_id), payload)


def record_snoozed(alert: Alert, round_number: int, now: datetime) -> None:
    """The page that did not go out, once per round (call inside the round's transaction)."""
    marker = f"(round {round_number}), snoozed until "
    if AuditEntry.objects.filter(
        action=PAGE_SNOOZED, target_type="alert", target_id=alert.pk, outcome__contains=marker
    ).exists():
        return
    text = f"{alert.severity} {alert.rule_name}: not paged {marker}{alert.snoozed_until:%H:%M} UTC"
    if alert.incident_id is not None:
        append_timeline(
            alert.incident_id,
            TimelineKind.NOTE,
            text,
            at=now,
            alert_id=alert.pk,
            step=alert.step,
            data={"notification": "snoozed", "round": round_number},
        )
    with audited(None, PAGE_SNOOZED, "alert", alert.pk, SYSTEM_CONTEXT) as attempt:
        attempt.team_id, attempt.level = alert.job.team_id, alert.severity
        attempt.allowed, attempt.reason = True, "snoozed by a person"
        attempt.succeeded(text)
