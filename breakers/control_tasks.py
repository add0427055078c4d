"""Celery tasks of the control plane: thin, idempotent, by id."""

from __future__ import annotations

from celery import shared_task
from django.db import transaction

from breakers.control import expire_overdue_commands, stop_hung_job


@shared_task(acks_late=True, ignore_result=True)
def expire_commands() -> int:
    """Beat: expire unacknowledged commands and hand the hung jobs to their executor."""
    with transaction.atomic():
        to_stop = expire_overdue_commands()
        for command_id in to_stop:
            transaction.on_commit(lambda command_id=command_id: stop_job.delay(command_id))
    return len(to_stop)


@shared_task(acks_late=True, ignore_result=True)
def stop_job(command_id: int) -> None:
    """Idempotent: the executor treats a process that is already gone as stopped."""
    stop_hung_job(command_id)
