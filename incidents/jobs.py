"""A job's life: created with its token, moved through its transition table, marked running,
its step advanced, retired."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from core.errors import Conflict, InvalidInput
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import append_timeline, resolve_alert, settle_incident
from incidents.models import (
    ACTIVE_ALERT_STATUSES,
    ACTIVE_INCIDENT_STATUSES,
    JOB_EVENTS,
    JOB_TRANSITIONS,
    AgentToken,
    Alert,
    Incident,
    Job,
    JobKind,
    Team,
    TimelineKind,
    job_statuses_for,
)


@dataclass(frozen=True)
class CreatedJob:
    job: Job
    raw_token: str
    team_created: bool


def create_job(team_name: str, name: str, kind: str = JobKind.TRAINING) -> CreatedJob:
    """Create a job (and its team if new) and issue its agent token, shown once."""
    errors = {}
    if not team_name.strip():
        errors["team"] = "must not be empty"
    if not name.strip():
        errors["name"] = "must not be empty"
    if kind not in JobKind.values:
        errors["kind"] = f"must be one of {', '.join(JobKind.values)}"
    if errors:
        raise InvalidInput("The job cannot be created.", fields=errors)
    with transaction.atomic():
        team, team_created = Team.objects.get_or_create(name=team_name.strip())
        if Job.objects.filter(team=team, name=name.strip()).exists():
            raise Conflict(
                f"Team {team.name!r} already has a job named {name.strip()!r}.",
                fields={"name": "already exists in this team"},
            )
        job = Job.objects.create(team=team, name=name.strip(), kind=kind)
        _, raw_token = AgentToken.issue(job)
    return CreatedJob(job=job, raw_token=raw_token, team_created=team_created)


def retire_job(job_id: int, reason: str, now: datetime | None = None) -> bool:
    """A run known to be over though it never said so (its process is gone: the demo was
    started again): terminated, with ``reason`` on its incident's timeline, and its alerts
    resolved, so its incident resolves and nothing shows it paused with an L3 firing for
    ever. Its history stays. False when the job was final already (then nothing changes)."""
    now = now or timezone.now()
    with transaction.atomic():
        if not move_job(job_id, "terminate", heartbeat_deadline=None):
            return False
        incident = Incident.objects.filter(
            job_id=job_id, status__in=ACTIVE_INCIDENT_STATUSES
        ).first()
        if incident is not None:
            append_timeline(incident.pk, TimelineKind.TERMINATED, f"Run over: {reason}", at=now)
        firing = Alert.objects.filter(job_id=job_id, status__in=ACTIVE_ALERT_STATUSES)
        for alert_id in firing.values_list("pk", flat=True):
            resolve_alert(alert_id, reason=f"the run is over: {reason}", now=now)
        settle_incident(job_id, None, now=now)
    return True


def move_job(job_id: int, event: str, **other_fields: Any) -> bool:
    """Apply one event of the job's state machine (``JOB_EVENTS``) as a compare-and-swap from
    every status the event may start from; False when the job is in none of them (somebody
    else moved it first, or the event does not apply), and then nothing is written."""
    (target,) = set(JOB_EVENTS[event].values())  # each event has one target status
    return compare_and_swap(
        Job,
        job_id,
        table=JOB_TRANSITIONS,
        expected=job_statuses_for(event),
        new=target,
        **other_fields,
    )


def mark_job_running(job_id: int) -> bool:
    """First sign of life from the agent: pending → running (no-op in any other state)."""
    return move_job(job_id, "start")


# Every metrics batch of every rank runs this UPDATE: plain SQL (both databases), since the
# ORM's building of it cost more than PostgreSQL's running it. current_step only moves
# forward: a late batch of old points must not rewind it.
# A job's newest metric time is kept to this precision: a batch within it of the stored time,
# and not ahead of the job's step, changes nothing and so does not lock the job's row.
METRIC_TIME_PRECISION_SECONDS = 1.0


_ADVANCE_SQL = (
    f"UPDATE {Job._meta.db_table} SET "
    "last_metric_at = CASE WHEN last_metric_at IS NULL OR last_metric_at < %(at)s "
    "THEN %(at)s ELSE last_metric_at END, "
    "current_step = CASE WHEN %(step)s IS NULL THEN current_step "
    "WHEN current_step IS NULL OR current_step < %(step)s THEN %(step)s ELSE current_step END "
    "WHERE id = %(job)s AND (last_metric_at IS NULL OR last_metric_at < %(stale)s "
    "OR (%(step)s IS NOT NULL AND (current_step IS NULL OR current_step < %(step)s)))"
)


def advance_current_step(job_id: int, step: int | None, last_metric_at: datetime) -> None:
    """A batch arrived: the job's newest metric time (to a second), and its step if the batch
    is ahead; nothing, and no row lock, when neither changes."""
    stale = last_metric_at - timedelta(seconds=METRIC_TIME_PRECISION_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(
            _ADVANCE_SQL,
            {
                "at": connection.ops.adapt_datetimefield_value(last_metric_at),
                "stale": connection.ops.adapt_datetimefield_value(stale),
                "step": step,
                "job": job_id,
            },
        )
