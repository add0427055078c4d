"""Delete raw points past the raw window and rollups past theirs; never the evidence.

Raw points older than ``METRIC_RAW_RETENTION_SECONDS`` are deleted, except:
- points not yet merged into the rollups (id above the job's ``RollupCursor``): a point is in
  the rollups before it may leave the raw table;
- points around any incident of the job (the *freeze*): from its first anomalous step minus
  ``METRIC_INCIDENT_MARGIN_STEPS`` up to the moment it resolved — and for ever while it is
  active (open or mitigated), so a review always has the raw curve of what happened.
Blocks (ingest's, and compaction's merged ones) follow the same rule: a day of them (a
partition) is dropped whole when no block of it must stay; the others are deleted block by
block. Rollups are deleted past
``METRIC_ROLLUP_RETENTION_DAYS``. Deletes go in batches of ids, each
its own short transaction, so ingest is not blocked behind one huge DELETE.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from breakers.models import MetricBlock
from breakers.storage import partitions
from breakers.storage.rollups import CURSORS, POINTS, ROLLUPS, supported
from incidents.models import ACTIVE_INCIDENT_STATUSES, Incident

INCIDENTS = Incident._meta.db_table
BLOCKS = MetricBlock._meta.db_table
BATCH_ROWS = 50_000

# The freeze of one incident, as a condition on a point ``p`` of the same job.
FROZEN = f"""EXISTS (
  SELECT 1 FROM {INCIDENTS} i
  WHERE i.job_id = p.job_id AND p.step >= i.first_step - %(margin)s
    AND (i.status = ANY(%(active)s) OR i.resolved_at IS NULL OR p.time <= i.resolved_at)
)"""

_RAW_SQL = f"""
DELETE FROM {POINTS} WHERE id IN (
  SELECT p.id FROM {POINTS} p
  WHERE p.job_id = %(job)s AND p.id <= %(cursor)s AND p.time < %(cutoff)s AND NOT {FROZEN}
  ORDER BY p.id LIMIT %(batch)s  -- oldest first: the (job, id) order is commit order
)
"""

# A compacted block ``b`` may hold a frozen point: the freeze's point condition, conservatively
# on the block's bounds (its last step, its first time). A block goes when every point in it
# is past the window and it is not frozen; a day partition when none of its blocks stays.
FROZEN_BLOCK = f"""EXISTS (
  SELECT 1 FROM {INCIDENTS} i
  WHERE i.job_id = b.job_id AND b.last_step >= i.first_step - %(margin)s
    AND (i.status = ANY(%(active)s) OR i.resolved_at IS NULL OR b.first_time <= i.resolved_at)
)"""

# A block ingest wrote that the rollups have not merged yet (its last_id above their cursor).
UNMERGED_BLOCK = (
    f"b.last_id > coalesce((SELECT c.cursor FROM {CURSORS} c WHERE c.job_id = b.job_id), 0)"
)

_BLOCKS_SQL = f"""
DELETE FROM {BLOCKS} WHERE id IN (
  SELECT b.id FROM {BLOCKS} b
  WHERE b.job_id = %(job)s AND b.last_id <= %(cursor)s AND b.last_time < %(cutoff)s
    AND NOT {FROZEN_BLOCK}
  ORDER BY b.id LIMIT %(batch)s
)
"""

_ROLLUP_SQL = f"""
DELETE FROM {ROLLUPS} WHERE id IN (
  SELECT id FROM {ROLLUPS} WHERE bucket < %(cutoff)s LIMIT %(batch)s
)
"""


@dataclass(frozen=True)
class Pruned:
    raw_points: int
    rollups: int
    blocks: int = 0  # compacted blocks of raw points (breakers.storage.compaction) deleted
    block_days: int = 0  # day partitions of blocks dropped whole (breakers.storage.partitions)


def freeze_params() -> dict:
    return {
        "margin": settings.METRIC_INCIDENT_MARGIN_STEPS,
        "active": [str(status) for status in ACTIVE_INCIDENT_STATUSES],
    }


def _delete_in_batches(sql: str, params: dict) -> int:
    deleted = 0
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, {**params, "batch": BATCH_ROWS})
            rows = cursor.rowcount
        deleted += rows
        if rows < BATCH_ROWS:
            return deleted


def prune(now: datetime | None = None) -> Pruned:
    """One retention pass over every job (idempotent: a second pass finds nothing to do)."""
    if not supported():
        return Pruned(0, 0)
    now = now or timezone.now()
    raw_cutoff = now - timedelta(seconds=settings.METRIC_RAW_RETENTION_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT job_id, cursor FROM {CURSORS} WHERE cursor > 0 ORDER BY job_id")
        marks = cursor.fetchall()
    # Whole days of blocks first: what they held needs no DELETE below.
    days = partitions.drop_expired(
        raw_cutoff, f"({FROZEN_BLOCK} OR {UNMERGED_BLOCK})", freeze_params()
    )
    raw = blocks = 0
    for job_id, mark in marks:
        params = {"job": job_id, "cursor": mark, "cutoff": raw_cutoff, **freeze_params()}
        raw += _delete_in_batches(_RAW_SQL, params)
        blocks += _delete_in_batches(_BLOCKS_SQL, params)
    rollup_cutoff = now - timedelta(days=settings.METRIC_ROLLUP_RETENTION_DAYS)
    rollups = _delete_in_batches(_ROLLUP_SQL, {"cutoff": rollup_cutoff})
    return Pruned(raw_points=raw, rollups=rollups, blocks=blocks, block_days=days)
