"""Celery tasks of metric storage: thin and idempotent (the cursor and the cut-offs make them
so); the beat runs them by these names (config/schedule.py)."""

from __future__ import annotations

import logging

from celery import shared_task

from breakers.storage import compaction, retention, rollups

log = logging.getLogger(__name__)


@shared_task(name="storage.roll_up", acks_late=True, ignore_result=True, expires=9)
def roll_up() -> int:
    return sum(rollups.roll_up_all().values())


@shared_task(name="storage.prune", acks_late=True, ignore_result=True, expires=240)
def prune() -> None:
    pruned = retention.prune()
    if any(pruned.__dict__.values()):
        log.info(
            "retention: %s raw points, %s rollups, %s compacted blocks and %s days of blocks "
            "deleted",
            pruned.raw_points,
            pruned.rollups,
            pruned.blocks,
            pruned.block_days,
        )


@shared_task(name="storage.compact", acks_late=True, ignore_result=True, expires=50)
def compact() -> int:
    return sum(compaction.compact_all().values())
