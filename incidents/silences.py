"""Silences and maintenance windows: the verbs (create, end), which silence holds an alert's
pages back, and the record of every page it held back.

A silence stops *pages*, never *brakes*: it is consulted only where a notification round is
about to page someone (``incidents.notifications.rounds.fire_round``). The evaluation, the
alert, its incident and the automatic L3/L4 command are untouched, so a maintenance window can
never keep a NaN run burning accelerators. Each held-back page is a timeline row (a note, so
the review's "time to notify" never counts it as a notification) and a system audit row.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from core.errors import InvalidInput, NotFound
from incidents.alerts import snooze
from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    Alert,
    AuditEntry,
    Job,
    NotificationRound,
    RoundStatus,
    Silence,
    Team,
    TimelineKind,
)
from incidents.teams.access import role_in_team, scoped_get, visible_team_ids
from incidents.teams.audit import SYSTEM_CONTEXT, AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User

# A silence without a bound is a team that forgot to switch its pages back on.
MAX_SILENCE = timedelta(days=14)
MAX_REASON = 1000
RECHECK = timedelta(seconds=30)  # how often a held-back round looks at its silence again
PAGE_SILENCED = "page_silenced"  # the audit action of a held-back page (system, not a person)


def active(at: datetime | None = None) -> QuerySet[Silence]:
    """Silences in force at ``at`` (now by default): started, not yet ended."""
    at = at or timezone.now()
    return Silence.objects.filter(starts_at__lte=at, ends_at__gt=at)


def applies(silence: Silence, team_id: int, job_id: int, rule_key: str) -> bool:
    """Whether ``silence`` (in force) covers an alert of this team, job and rule."""
    return (
        silence.team_id == team_id
        and silence.job_id in (None, job_id)
        and silence.rule_key in ("", rule_key)
    )


def silence_for(alert: Alert, at: datetime | None = None) -> Silence | None:
    """The silence holding the alert's pages back at ``at``, the longest-lasting one if
    several do; None when its pages go out."""
    return (
        active(at)
        .filter(team_id=alert.job.team_id)
        .filter(Q(job__isnull=True) | Q(job_id=alert.job_id))
        .filter(Q(rule_key="") | Q(rule_key=alert.rule_key))
        .select_related("created_by", "job")
        .order_by("-ends_at", "-id")
        .first()
    )


def matching(silences: Iterable[Silence], alert: Alert) -> Silence | None:
    """``silence_for`` over silences already fetched (a page lists many alerts)."""
    found = [s for s in silences if applies(s, alert.job.team_id, alert.job_id, alert.rule_key)]
    return max(found, key=lambda s: (s.ends_at, s.pk), default=None)


def hold_back(alert: Alert, round_: NotificationRound, now: datetime) -> bool:
    """True when the alert is snoozed, or a silence covers it, at ``now``: the round pages
    nobody and is put off until the snooze or silence ends, looked at again every RECHECK
    meanwhile (a silence ended early lets the page out within that). An alert still firing
    when it is over pages then. The first hold-back of each round is recorded. Call under the
    alert's row lock."""
    if alert.snoozed_until is not None and snooze.snoozed(alert, now):
        # One alert snoozed by on-call: the same hold, bounded by the snooze (4 h at most).
        _put_off(round_, alert.snoozed_until, now)
        snooze.record_snoozed(alert, round_.number, now)
        return True
    silence = silence_for(alert, now)
    if silence is None:
        return False
    _put_off(round_, silence.ends_at, now)
    if not _recorded(alert, silence, round_.number):
        record_silenced(alert, silence, round_.number, now)
    return True


def _put_off(round_: NotificationRound, until: datetime, now: datetime) -> None:
    NotificationRound.objects.filter(pk=round_.pk, status=RoundStatus.SCHEDULED).update(
        due_at=min(until, now + RECHECK)
    )


def _recorded(alert: Alert, silence: Silence, round_number: int) -> bool:
    return AuditEntry.objects.filter(
        action=PAGE_SILENCED,
        target_type="alert",
        target_id=alert.pk,
        outcome__contains=f"(round {round_number}), silenced by silence #{silence.pk} ",
    ).exists()


def record_silenced(alert: Alert, silence: Silence, round_number: int, now: datetime) -> None:
    """The page that did not go out: on the incident's timeline and in the audit trail
    (call inside the round's transaction)."""
    who = silence.created_by.get_username() if silence.created_by else "someone"
    text = (
        f"{alert.severity} {alert.rule_name}: not paged (round {round_number}), silenced by "
        f"silence #{silence.pk} of {who} until {silence.ends_at:%Y-%m-%d %H:%M} UTC: "
        f"{silence.reason}"
    )
    if alert.incident_id is not None:
        append_timeline(
            alert.incident_id,
            TimelineKind.NOTE,
            text,
            at=now,
            alert_id=alert.pk,
            step=alert.step,
            data={"notification": "silenced", "silence_id": silence.pk, "round": round_number},
        )
    with audited(None, PAGE_SILENCED, "alert", alert.pk, SYSTEM_CONTEXT) as attempt:
        attempt.team_id, attempt.level = alert.job.team_id, alert.severity
        attempt.allowed, attempt.reason = True, f"silence #{silence.pk}: {silence.reason}"
        attempt.succeeded(text)


# --- The verbs ---------------------------------------------------------------------------------


def _clean(
    team: Team,
    job_id: int | None,
    rule_key: str,
    starts_at: datetime,
    ends_at: datetime,
    reason: str,
    now: datetime,
) -> Job | None:
    """InvalidInput (400, naming the field) for anything a silence may not be."""
    reason = reason.strip()
    if not reason or len(reason) > MAX_REASON:
        raise InvalidInput(
            "A silence needs a reason (at most 1000 characters).",
            fields={"reason": "why the pages stop (kept in the audit trail)"},
        )
    if len(rule_key) > 100 or "\x00" in rule_key:
        raise InvalidInput("Bad rule key.", fields={"rule_key": "at most 100 characters"})
    if ends_at <= starts_at or ends_at <= now:
        raise InvalidInput(
            "A silence must end after it starts, and in the future.",
            fields={"ends_at": "after starts_at and after now"},
        )
    if ends_at - max(starts_at, now) > MAX_SILENCE:
        raise InvalidInput(
            "A silence lasts at most 14 days.", fields={"ends_at": "at most 14 days from its start"}
        )
    if job_id is None:
        return None
    job = Job.objects.filter(pk=job_id, team=team).first()
    if job is None:
        raise InvalidInput(
            f"Team {team.name!r} has no job {job_id}.", fields={"job_id": "a job of this team"}
        )
    return job


def create_silence(
    user: User,
    team_id: int,
    *,
    ends_at: datetime,
    reason: str,
    job_id: int | None = None,
    rule_key: str = "",
    starts_at: datetime | None = None,
    context: AuditContext | None = None,
) -> Silence:
    """Hold back the team's pages (of one job, one rule) from ``starts_at`` (now) to
    ``ends_at`` (managers; audited)."""
    with audited(user, Action.MANAGE_SILENCES, "team", team_id, context) as attempt:
        team = scoped_get(Team.objects, user, team_id, team_path="id", noun="team", attempt=attempt)
        attempt.check(decide(role_in_team(user, team.pk), Action.MANAGE_SILENCES))
        now = timezone.now()
        starts_at = starts_at or now
        job = _clean(team, job_id, rule_key.strip(), starts_at, ends_at, reason, now)
        with transaction.atomic():
            silence = Silence.objects.create(
                team=team,
                job=job,
                rule_key=rule_key.strip(),
                starts_at=starts_at,
                ends_at=ends_at,
                reason=reason.strip(),
                created_by=user,
            )
            attempt.succeeded(f"{silence}: {silence.reason}")
    return silence


def end_silence(user: User, silence_id: int, *, context: AuditContext | None = None) -> Silence:
    """End a silence now (managers; audited). Ending one that has not started makes it
    zero-length; ending one already over is a no-op that says so in its audit row."""
    with audited(user, Action.MANAGE_SILENCES, "silence", silence_id, context) as attempt:
        silence = scoped_get(
            Silence.objects, user, silence_id, team_path="team_id", noun="silence", attempt=attempt
        )
        attempt.check(decide(role_in_team(user, silence.team_id), Action.MANAGE_SILENCES))
        now = timezone.now()
        with transaction.atomic():
            locked = Silence.objects.select_for_update().get(pk=silence.pk)
            if locked.ends_at <= now:
                attempt.succeeded(f"silence #{locked.pk} had already ended")
                return locked
            locked.ends_at = max(now, locked.starts_at)
            locked.ended_by = user
            locked.save(update_fields=["ends_at", "ended_by"])
            attempt.succeeded(f"silence #{locked.pk} ended early")
    return locked


def visible_silences(user: User, *, team_id: int | None = None) -> QuerySet[Silence]:
    """The silences of the user's teams (one team's when given; 404 for another team)."""
    teams = visible_team_ids(user)
    if team_id is not None:
        if team_id not in teams:
            raise NotFound(f"There is no team {team_id}.")
        teams = [team_id]
    return Silence.objects.filter(team_id__in=teams).select_related(
        "team", "job", "created_by", "ended_by"
    )
