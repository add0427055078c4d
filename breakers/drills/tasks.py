"""The drills' Celery task: thin, idempotent, named (the service is ``paging.page_failed_set``)."""

from __future__ import annotations

from celery import shared_task

from breakers.drills.paging import page_failed_set


@shared_task(name="drills.page_failed_set", acks_late=True, ignore_result=True)
def page_failed_set_task(drill_set: str) -> int:
    return len(page_failed_set(drill_set))
