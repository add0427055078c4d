"""The straggler check on the beat (config/schedule.py), by its explicit name."""

from __future__ import annotations

from celery import shared_task

from breakers.pace import checks


@shared_task(name="pace.check_stragglers", acks_late=True, ignore_result=True, expires=25)
def check_stragglers() -> int:
    return sum(1 for found in checks.check_running_jobs().values() for s in found if s.straggler)
