"""Celery tasks of the control plane: thin, idempotent, by id."""

from __future__ import annotations

from celery import shared_task

from breakers.control.commands import stop_hung_job
from breakers.control.escalations import expire_escalations as expire_due_escalations
from breakers.control.watchdog import watchdog_tick
from breakers.recovery.service import consider_recovery as consider


@shared_task(name="control.watchdog", acks_late=True, ignore_result=True, expires=5)
def watchdog() -> int:
    """Beat, every second: expire unacknowledged commands, stop the hung jobs."""
    return len(watchdog_tick(lambda command_id: stop_job.delay(command_id)))


@shared_task(name="control.stop_job", acks_late=True, ignore_result=True)
def stop_job(command_id: int) -> None:
    """Idempotent: the executor treats a process that is already gone as stopped."""
    stop_hung_job(command_id)


@shared_task(name="escalations.expire", acks_late=True, ignore_result=True, expires=25)
def expire_escalations() -> int:
    """Beat, every 30 s: expire undecided escalation requests. Idempotent (compare-and-swap
    per request), so an overlapping or redelivered run does nothing twice. Here, not in
    ``incidents``: an expiry may issue the system's automatic L3 pause, a command."""
    return len(expire_due_escalations())


@shared_task(name="control.consider_recovery", acks_late=True, ignore_result=True)
def consider_recovery(pause_id: int) -> None:
    """An automatic L3 brake's checkpoint is confirmed: record the recovery verdict and act
    on it. Idempotent: one verdict per brake (breakers.recovery.service)."""
    consider(pause_id)
