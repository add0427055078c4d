"""Celery tasks of the breaker engine: thin, by job id, idempotent (the service makes them so).

Coalescing: ``schedule_evaluation`` enqueues ``evaluate_job`` only when none is queued for the
job yet — a Redis ``SET NX EX`` flag per job. The task clears the flag *before* it reads any
point, so points committed while it runs enqueue exactly one follow-up, and a burst of 100
batches queues a handful of tasks, not 100. The flag expires on its own (``QUEUED_TTL``), so a
lost message cannot block a job for good; the periodic tick also evaluates whatever is pending.

A brake that awaits the job's other ranks' holds (``evaluation.AwaitHolds``) re-queues the
evaluation a moment later through the same flag: the batches that land meanwhile (the other
nodes' holds) are evaluated by that one task, and no lock is held while it waits. Not in the
embedded mode, whose tasks run in-process at once: there a brake is issued without waiting.
"""

from __future__ import annotations

import contextlib
import logging
import time
from functools import cache

from celery import shared_task
from django.conf import settings

from breakers.detection import evaluation, rulesets
from breakers.drills.runs import expire_stale_runs, request_drills
from core.errors import Conflict
from core.redis_clients import redis_client
from core.transient import TRANSIENT_ERRORS
from incidents.models import UNHELD_JOB_STATUSES, Job, Team

log = logging.getLogger(__name__)

QUEUED_TTL_SECONDS = 60
# How often an evaluation whose brake awaits the other ranks' holds looks again: the last
# hold is seen at most this late.
AWAIT_HOLDS_POLL_SECONDS = 0.2
# Jobs that get periodic ticks: node-failure windows and silences are judged even when no
# point arrives. A paused job's open alerts stay open: nothing has shown them to clear.
TICKED_JOB_STATUSES = UNHELD_JOB_STATUSES


@cache
def _redis():
    """One client per process, so its connection pool is shared (as console.ratelimit does)."""
    return redis_client()


def _flag(kind: str, job_id: int) -> str:
    return f"{settings.CHANNEL_PREFIX}:breakers:{kind}-queued:{job_id}"


def _claim(kind: str, job_id: int) -> bool:
    """True when no task of ``kind`` was queued for the job (and now one is to be)."""
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return True  # embedded mode: tasks run in-process at once, nothing is ever queued
    return bool(_redis().set(_flag(kind, job_id), 1, nx=True, ex=QUEUED_TTL_SECONDS))


def _release(kind: str, job_id: int) -> None:
    if not settings.CELERY_TASK_ALWAYS_EAGER:
        _redis().delete(_flag(kind, job_id))


def schedule_evaluation(job_id: int, countdown: float = 0.0) -> bool:
    """Enqueue ``evaluate_job`` (``countdown`` seconds from now) unless one is already
    queued; call it after commit."""
    if not _claim("evaluate", job_id):
        return False
    try:
        if countdown > 0:
            evaluate_job.apply_async((job_id,), countdown=countdown)
        else:  # no countdown at all: a task with one waits in the worker's timer
            evaluate_job.delay(job_id)
    except Exception:
        _release("evaluate", job_id)  # not queued after all: let the next batch try again
        raise
    return True


@shared_task(
    name="detection.evaluate_job",
    acks_late=True,
    ignore_result=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=True,
    max_retries=5,
)
def evaluate_job(job_id: int) -> int:
    """Evaluate the job's new points; returns how many."""
    # Before reading: a batch committed from now on must schedule a follow-up, not be lost.
    _release("evaluate", job_id)
    return fail_safe(job_id)


def fail_safe(job_id: int, tick_at: float | None = None) -> int:
    """One job's evaluation, failing safe: a transient database error is retried (raised to
    the task's autoretry); any other error is this job's alone. It becomes the job's L3
    "breakers failing" alert, paged to the on-call, and never reaches another job's
    evaluation (nor the periodic tick that loops over the jobs)."""
    await_holds = not settings.CELERY_TASK_ALWAYS_EAGER  # see the module doc
    try:
        report = evaluation.evaluate_job(job_id, tick_at=tick_at, await_holds=await_holds)
    except TRANSIENT_ERRORS:
        raise
    except Exception as error:
        log.exception("evaluation of job %s failed", job_id)
        evaluation.report_failing_breakers(job_id, error)
        return 0
    with contextlib.suppress(*TRANSIENT_ERRORS):  # the next evaluation clears it
        evaluation.clear_failing_breakers(job_id)
    if report.holds_wait > 0:
        schedule_evaluation(job_id, countdown=min(report.holds_wait, AWAIT_HOLDS_POLL_SECONDS))
    return report.points


@shared_task(name="detection.tick_evaluations", acks_late=True, ignore_result=True)
def tick_evaluations() -> int:
    """Beat (every few seconds): enqueue a tick for each running job, coalesced per job."""
    enqueued = 0
    job_ids = Job.objects.filter(status__in=TICKED_JOB_STATUSES).values_list("pk", flat=True)
    for job_id in job_ids:
        # One job's tick cannot stop the others' (in embedded mode, delay() runs it here).
        try:
            if _claim("tick", job_id):
                tick_job.delay(job_id)
                enqueued += 1
        except Exception:
            log.exception("tick of job %s could not run", job_id)
    return enqueued


@shared_task(
    name="detection.tick_job",
    acks_late=True,
    ignore_result=True,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=True,
    max_retries=3,
)
def tick_job(job_id: int) -> int:
    """Evaluate pending points, then judge the time-based detectors now."""
    _release("tick", job_id)
    return fail_safe(job_id, tick_at=time.time())


@shared_task(name="rulesets.schedule_drills", acks_late=True, ignore_result=True)
def schedule_drills() -> int:
    """Beat (hourly): end the drills whose runner died (``expire_stale_runs``), then queue each
    team's drill set that is due (``rulesets.due_drills``), as the system. Idempotent: a set
    queued in this period for this rule-set version (by the schedule or a person) makes the
    team not due, and the schedule's key is unique per scenario, so two beats racing past that
    check, or a retry, queue it once."""
    for run_id in expire_stale_runs():
        log.warning("drill #%s lost its runner: marked error", run_id)
    if not settings.DRILL_SCHEDULE:
        return 0  # BRAKELINE_DRILL_SCHEDULE=false
    queued = 0
    for drill in rulesets.due_drills():
        log.info("drill set due: %s %s", drill.idempotency_key, ", ".join(drill.scenarios))
        try:
            team = Team.objects.get(pk=drill.team_id)
            request_drills(team, drill.scenarios, schedule_key=drill.idempotency_key)
        except Conflict as conflict:
            log.info("%s", conflict)  # the other beat's
            continue
        queued += 1
    return queued
