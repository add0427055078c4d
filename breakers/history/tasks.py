"""Celery tasks of metric history: thin, idempotent (the cursor and the cut-offs make them so)."""

from __future__ import annotations

import logging

from celery import shared_task

from breakers.history import retention, rollups

log = logging.getLogger(__name__)


@shared_task(name="history.roll_up", acks_late=True, ignore_result=True, expires=9)
def roll_up() -> int:
    merged = rollups.roll_up_all()
    return sum(merged.values())


@shared_task(name="history.prune", acks_late=True, ignore_result=True, expires=240)
def prune() -> None:
    pruned = retention.prune()
    if pruned.raw_points or pruned.rollups:
        log.info("retention: %s raw points and %s rollups deleted", *pruned.__dict__.values())
