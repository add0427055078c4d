"""The heartbeat watchdog: a job whose agent went silent past its deadline is braked (L3).

One indexed query per tick finds the overdue jobs (the ``heartbeat_deadline`` column, not a
scan of heartbeats). Each silence raises its alert once — the claim on
``heartbeat_overdue_since`` is a compare-and-swap, so two watchdogs never both raise it — and
the next heartbeat clears it (``incidents.jobs.record_heartbeat``). The alert's action is
checkpoint_and_pause: a job that is merely slow answers it; a hung one does not, its command
expires, and the executor stops it from the outside.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from breakers.control.braking import brake_for_alert
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.jobs import HEARTBEAT_RULE_KEY, heartbeat_timeout_seconds
from incidents.models import Job, JobStatus
from incidents.notifications.delivery import notify_alert

WATCHED_STATUSES = (JobStatus.RUNNING, JobStatus.PAUSING)


def heartbeat_signal(job: Job, now: datetime) -> AlertSignal:
    timeout = heartbeat_timeout_seconds(job)
    # Only jobs that heartbeated have a deadline, so only they are ever overdue.
    assert job.last_heartbeat_at is not None
    silent = (now - job.last_heartbeat_at).total_seconds()
    step = job.last_heartbeat_step or 0
    basis = (
        f"8× the measured step time {job.step_time_seconds:.3g} s"
        if job.step_time_seconds and not job.heartbeat_timeout_seconds
        else "the job's timeout"
    )
    return AlertSignal(
        rule_key=HEARTBEAT_RULE_KEY,
        rule_name="Heartbeat timeout",
        layer="health",
        severity="L3",
        metric="heartbeat",
        node="",
        value=silent,
        threshold=timeout,
        description=f"no heartbeat for {silent:.1f} s (timeout {timeout:.3g} s, {basis}); "
        f"last step {step}",
        step=step,
        time=now,
        first_step=step,
        first_time=job.last_heartbeat_at,
        duration_seconds=silent,
        action="checkpoint_and_pause",
        runbook_hint="hung_no_logs",
    )


def overdue_jobs(now: datetime) -> list[Job]:
    return list(
        Job.objects.filter(
            heartbeat_deadline__lt=now,
            heartbeat_overdue_since__isnull=True,
            status__in=WATCHED_STATUSES,
        ).order_by("heartbeat_deadline")
    )


def check_heartbeats(now: datetime | None = None) -> list[int]:
    """Raise (once) the L3 heartbeat alert of every overdue job; returns their alert ids."""
    now = now or timezone.now()
    raised = []
    for job in overdue_jobs(now):
        with transaction.atomic():
            claimed = Job.objects.filter(
                pk=job.pk,
                heartbeat_overdue_since__isnull=True,
                heartbeat_deadline__lt=now,
            ).update(heartbeat_overdue_since=now)
            if not claimed:
                continue  # another watchdog took it, or a heartbeat arrived meanwhile
            outcome = raise_or_update_alert(job.pk, heartbeat_signal(job, now), now=now)
            if outcome.action_due:
                brake_for_alert(outcome.alert)
                notify_alert(outcome.alert.pk)  # after commit
            raised.append(outcome.alert.pk)
    return raised
