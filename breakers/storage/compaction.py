"""Compact metric points into wide blocks: one row per rank, node and up to 256 steps.

On PostgreSQL ingest already writes each batch as blocks (one per rank and node of the batch,
``breakers.agent.store``); a job logging a few points a second makes narrow ones, each with a
row's overhead (~150 bytes and three index entries). Compaction merges a rank's narrow blocks
(and the raw rows of a console upgraded from one-row-per-point storage) into blocks of up to
256 steps: steps and times once, every metric's values as one 2-D ``float8[]``, ~8 bytes a point
for dense series, measured by ``bench/storage.py``.

Only points both the evaluator and the rollups are past are compacted (ids at or below the
lesser of their cursors), so neither ever reads a merged block: they walk ``id > cursor`` over
ingest's blocks and raw rows (``breakers.storage.points``). Every other reader goes through the
``brakeline_points`` SQL function, which sees raw rows and blocks as one set. A round deletes
the narrow blocks and raw rows, writes the merged blocks and moves the job's
``CompactionCursor`` by compare-and-swap in one transaction: a reader sees every point exactly
once, before or after, and two rounds racing on one job commit once (the loser rolls back
whole and finds nothing to do next time).

PostgreSQL only: the embedded SQLite mode keeps one row per point (demo-sized runs).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from breakers.control.duties import per_job
from breakers.models import CompactionCursor, EvaluationState, MetricBlock, MetricPoint
from breakers.storage import partitions
from breakers.storage.blocks import blocks_of
from breakers.storage.points import next_chunk, oldest_after
from breakers.storage.rollups import CURSORS as ROLLUP_CURSORS
from breakers.storage.rollups import supported
from incidents.models import Job

log = logging.getLogger(__name__)

POINTS = MetricPoint._meta.db_table
BLOCKS = MetricBlock._meta.db_table
COMPACTION = CompactionCursor._meta.db_table
EVALUATION = EvaluationState._meta.db_table
JOBS = Job._meta.db_table

BATCH_POINTS = 200_000  # per transaction: bounded lock time and memory

COPY_BLOCKS_SQL, COPY_BLOCK_TYPES = partitions.copy_blocks(with_last_id=True)

# Jobs with points both cursors are past and not compacted yet.
_DUE_SQL = f"""
SELECT e.job_id, least(e.cursor, r.cursor), coalesce(c.cursor, 0), j.last_metric_at
FROM {EVALUATION} e JOIN {ROLLUP_CURSORS} r ON r.job_id = e.job_id
JOIN {JOBS} j ON j.id = e.job_id
LEFT JOIN {COMPACTION} c ON c.job_id = e.job_id
WHERE least(e.cursor, r.cursor) > coalesce(c.cursor, 0)
ORDER BY e.job_id
"""

# Raw rows (a console upgraded from row storage) and ingest's narrow blocks, as points; a
# re-logged step's points in the order they were logged.
_READ_SQL = """
SELECT id, name, step, (extract(epoch FROM time) * 1000000)::int8, value, node, rank
FROM brakeline_points_after(%s, %s, %s) ORDER BY id, time
"""
_DELETE_ROWS_SQL = f"DELETE FROM {POINTS} WHERE job_id = %s AND id > %s AND id <= %s"
_DELETE_BLOCKS_SQL = f"""
DELETE FROM {BLOCKS} WHERE job_id = %s AND last_id > %s AND last_id <= %s
RETURNING (SELECT count(v) FROM unnest(vals) AS v)
"""


class Conflict(Exception):
    """Another round compacted (or retention deleted) some of these points first."""


def _compact_chunk(job_id: int, after: int, bound: int) -> tuple[int, int]:
    """Compact about ``BATCH_POINTS`` points of the job above ``after`` and at most ``bound``
    (whole blocks); returns (points compacted, the cursor reached). Raises Conflict when another
    round won."""
    # Read before the transaction: no point is ever committed at or below the bound later, and
    # none is updated, so the only change until the DELETE is a deletion (another round, or
    # retention) — which the DELETE's count catches. The blocks' day partitions are created
    # in between, outside the transaction: creating one locks the table, briefly.
    chunk = next_chunk(job_id, after, BATCH_POINTS)
    if chunk.high is None:
        return 0, bound
    # The bound is a cursor, so a block's edge: (after, high] holds whole blocks.
    high = bound if not chunk.more or chunk.high >= bound else chunk.high
    with connection.cursor() as cursor:
        cursor.execute(_READ_SQL, [job_id, after, high])
        points = cursor.fetchall()
    if not points:
        return 0, high
    rows = [block.row(job_id) for block in blocks_of(points)]
    partitions.ensure(min(row[5] for row in rows), max(row[5] for row in rows))
    with transaction.atomic(), connection.cursor() as cursor:
        # Deleted before the merged blocks are written: their last_ids lie in (after, high] too.
        cursor.execute(_DELETE_ROWS_SQL, [job_id, after, high])
        deleted = cursor.rowcount
        cursor.execute(_DELETE_BLOCKS_SQL, [job_id, after, high])
        deleted += sum(row[0] for row in cursor.fetchall())
        if deleted != len(points):
            raise Conflict(f"job {job_id}: {deleted} points deleted, {len(points)} read")
        with cursor.cursor.copy(COPY_BLOCKS_SQL) as copy:
            copy.set_types(COPY_BLOCK_TYPES)
            for row in rows:
                copy.write_row(row)
        _advance(cursor, job_id, after, high, sorted({p[1] for p in points}), len(points))
    return len(points), high


def _advance(cursor, job_id: int, after: int, high: int, names: list[str], count: int) -> None:
    """Compare-and-swap the cursor from ``after`` to ``high`` (the row is created at 0)."""
    cursor.execute(
        f"INSERT INTO {COMPACTION} (job_id, cursor, names, points, updated_at) "
        "VALUES (%s, 0, '[]', 0, now()) ON CONFLICT (job_id) DO NOTHING",
        [job_id],
    )
    cursor.execute(
        f"UPDATE {COMPACTION} SET cursor = %s, points = points + %s, updated_at = now(), "
        "names = (SELECT coalesce(jsonb_agg(n ORDER BY n), '[]') FROM ("
        "SELECT jsonb_array_elements_text(names) UNION SELECT unnest(%s::text[])) AS u(n)) "
        "WHERE job_id = %s AND cursor = %s",
        [high, count, names, job_id, after],
    )
    if cursor.rowcount != 1:
        raise Conflict(f"job {job_id}: the compaction cursor moved from {after}")


def compact_job(job_id: int, after: int, bound: int) -> int:
    """Compact the job's points in ``(after, bound]``, a transaction per chunk; the count."""
    total = 0
    while after < bound:
        count, after = _compact_chunk(job_id, after, bound)
        total += count
    return total


def _is_due(job_id: int, after: int, last_metric_at: datetime | None, since: datetime) -> bool:
    """Its oldest point not compacted is older than ``since``, or the job went quiet then."""
    if last_metric_at is None or last_metric_at < since:
        return True
    oldest = oldest_after(job_id, after)  # its time: ingest keeps it within a day of the server's
    return oldest is not None and oldest < since


def compact_all(now: datetime | None = None) -> dict[int, int]:
    """One round over every job with points to compact: job id → points compacted. A job's
    points wait ``METRIC_COMPACT_AFTER_SECONDS``: the live tail stays raw, and a round folds
    a stretch of each rank's steps that long (fuller blocks than a round per minute would)."""
    if not supported():
        return {}
    since = (now or timezone.now()) - timedelta(seconds=settings.METRIC_COMPACT_AFTER_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute(_DUE_SQL)
        due = cursor.fetchall()
    done = {}
    for job_id, bound, after, last_metric_at in due:
        if not _is_due(job_id, after, last_metric_at, since):
            continue
        with per_job(
            "compact", job_id, savepoint=False
        ):  # any other failure: logged, counted, next job
            try:
                done[job_id] = compact_job(job_id, after, bound)
            except (Conflict, ValueError) as skipped:
                log.info("compaction of job %s skipped: %s", job_id, skipped)
    return done
