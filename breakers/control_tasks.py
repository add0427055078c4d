"""Celery tasks of the control plane: thin, idempotent, by id."""

from __future__ import annotations

from celery import shared_task

from breakers.control import stop_hung_job
from breakers.watchdog import watchdog_tick


@shared_task(name="control.watchdog", acks_late=True, ignore_result=True, expires=5)
def watchdog() -> int:
    """Beat, every second: expire unacknowledged commands, stop the hung jobs."""
    return len(watchdog_tick(lambda command_id: stop_job.delay(command_id)))


@shared_task(name="control.stop_job", acks_late=True, ignore_result=True)
def stop_job(command_id: int) -> None:
    """Idempotent: the executor treats a process that is already gone as stopped."""
    stop_hung_job(command_id)
