"""Services for teams, jobs and agents: one function per verb, used by every entry point."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

# Alert and incident services live in incidents.alerts; re-exported so every verb of the app is
# reachable from here.
from incidents.alerts import (  # noqa: F401
    AlertOutcome,
    AlertSignal,
    active_alert,
    alert_payload,
    append_timeline,
    raise_or_update_alert,
    resolve_alert,
)
from incidents.errors import Conflict, InvalidInput, Unauthenticated
from incidents.models import (
    JOB_TRANSITIONS,
    AgentToken,
    Job,
    JobKind,
    JobStatus,
    Team,
    hash_token,
)
from incidents.transitions import compare_and_swap

# Heartbeat timeout: the job's own setting, else this many measured step times, never below
# the floor (a fast toy job must not be declared hung by one slow garbage collection), and a
# fixed default until a step time has been measured.
HEARTBEAT_STEP_TIME_MULTIPLIER = 8.0
HEARTBEAT_TIMEOUT_FLOOR_SECONDS = 10.0
HEARTBEAT_TIMEOUT_DEFAULT_SECONDS = 60.0
# The alert the heartbeat watchdog raises (breakers.heartbeats) and a heartbeat resolves.
HEARTBEAT_RULE_KEY = "heartbeat-timeout"
# Weight of the newest measurement in the step-time moving average.
STEP_TIME_SMOOTHING = 0.2


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


def issue_agent_token(job: Job) -> str:
    """A new token for ``job`` (the old ones stay valid until revoked)."""
    return AgentToken.issue(job)[1]


def revoke_agent_tokens(job: Job) -> int:
    return AgentToken.objects.filter(job=job, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


def authenticate_agent(raw_token: str) -> Job:
    """The job a raw agent token belongs to; Unauthenticated if unknown or revoked."""
    token = (
        AgentToken.objects.select_related("job", "job__team")
        .filter(token_hash=hash_token(raw_token))
        .first()
    )
    if token is None:
        raise Unauthenticated("The agent token is unknown.", code="unknown_token")
    if token.revoked_at is not None:
        raise Unauthenticated("The agent token has been revoked.", code="revoked_token")
    return token.job


def mark_job_running(job_id: int) -> bool:
    """First sign of life from the agent: pending → running (no-op in any other state)."""
    return compare_and_swap(
        Job, job_id, table=JOB_TRANSITIONS, expected=[JobStatus.PENDING], new=JobStatus.RUNNING
    )


def advance_current_step(job_id: int, step: int | None, **other_fields: object) -> None:
    """current_step only moves forward (a late batch of old points must not rewind it)."""
    if step is not None:
        # Coalesce: SQLite's MAX() of NULL and a number is NULL, PostgreSQL's GREATEST is not.
        other_fields["current_step"] = Greatest(Coalesce(F("current_step"), step), step)
    Job.objects.filter(pk=job_id).update(**other_fields)


def heartbeat_timeout_seconds(job: Job) -> float:
    if job.heartbeat_timeout_seconds:
        return job.heartbeat_timeout_seconds
    if job.step_time_seconds:
        return max(
            HEARTBEAT_TIMEOUT_FLOOR_SECONDS, HEARTBEAT_STEP_TIME_MULTIPLIER * job.step_time_seconds
        )
    return HEARTBEAT_TIMEOUT_DEFAULT_SECONDS


def _measured_step_time(job: Job, step: int, now: datetime) -> float | None:
    previous_step, previous_time = job.last_heartbeat_step, job.last_heartbeat_at
    if previous_step is None or previous_time is None or step <= previous_step:
        return job.step_time_seconds
    sample = (now - previous_time).total_seconds() / (step - previous_step)
    if job.step_time_seconds is None:
        return sample
    return (1 - STEP_TIME_SMOOTHING) * job.step_time_seconds + STEP_TIME_SMOOTHING * sample


def record_heartbeat(
    job_id: int,
    *,
    step: int,
    status: str,
    pid: int | None = None,
    hostname: str = "",
    now: datetime | None = None,
) -> Job:
    """Store a heartbeat: last seen, step, measured step time and the next deadline."""
    now = now or timezone.now()
    with transaction.atomic():
        # The row lock keeps two heartbeats of one job from measuring against the same previous.
        job = Job.objects.select_for_update().get(pk=job_id)
        job.step_time_seconds = _measured_step_time(job, step, now)
        job.last_heartbeat_at = now
        job.last_heartbeat_step = step
        job.agent_status = status
        if pid is not None:
            job.agent_pid = pid
        if hostname:
            job.agent_hostname = hostname
        job.heartbeat_deadline = now + timedelta(seconds=heartbeat_timeout_seconds(job))
        job.save(
            update_fields=[
                "step_time_seconds",
                "last_heartbeat_at",
                "last_heartbeat_step",
                "agent_status",
                "agent_pid",
                "agent_hostname",
                "heartbeat_deadline",
            ]
        )
        advance_current_step(job_id, step)
        if status == "finished":
            compare_and_swap(
                Job,
                job_id,
                table=JOB_TRANSITIONS,
                expected=[JobStatus.PENDING, JobStatus.RUNNING],
                new=JobStatus.FINISHED,
                heartbeat_deadline=None,
            )
        else:
            mark_job_running(job_id)
        if job.heartbeat_overdue_since is not None:
            _end_heartbeat_silence(job, now)
    job.refresh_from_db()
    return job


def _end_heartbeat_silence(job: Job, now: datetime) -> None:
    """Heartbeats are back: clear the edge trigger and resolve the watchdog's alert."""
    Job.objects.filter(pk=job.pk).update(heartbeat_overdue_since=None)
    alert = active_alert(job.pk, HEARTBEAT_RULE_KEY, "")
    if alert is not None:
        silent = (now - job.heartbeat_overdue_since).total_seconds()
        resolve_alert(
            alert.pk,
            reason=f"heartbeats are back ({silent:.1f} s after the alert)",
            step=job.last_heartbeat_step,
            now=now,
        )
