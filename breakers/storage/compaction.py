"""Compact raw metric points into blocks: one row per rank, node and up to 256 steps.

A point as a row costs ~200 bytes (tuple header, job, name, step, time, node, rank, three
indexes). A block (``MetricBlock``) keeps a rank's steps and times once and the values of every
metric as one 2-D ``float8[]``: ~8 bytes a point for dense series, measured by
``bench/storage.py``.

Only points both the evaluator and the rollups are past are compacted (ids at or below the
lesser of their cursors), so neither ever reads a block: they walk ``id > cursor`` on the raw
table as before. Every other raw reader goes through the ``brakeline_points`` SQL function,
which sees raw rows and blocks as one set. A round writes the blocks, deletes the raw rows they
hold and moves the job's ``CompactionCursor`` by compare-and-swap in one transaction: a reader
sees every point exactly once, before or after, and two rounds racing on one job commit once
(the loser rolls back whole and finds nothing to do next time).

PostgreSQL only: the embedded SQLite mode keeps one row per point (demo-sized runs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from breakers.models import CompactionCursor, EvaluationState, MetricBlock, MetricPoint
from breakers.storage import partitions
from breakers.storage.rollups import CURSORS as ROLLUP_CURSORS
from breakers.storage.rollups import supported
from incidents.models import Job

log = logging.getLogger(__name__)

POINTS = MetricPoint._meta.db_table
BLOCKS = MetricBlock._meta.db_table
COMPACTION = CompactionCursor._meta.db_table
EVALUATION = EvaluationState._meta.db_table
JOBS = Job._meta.db_table

BLOCK_COLUMNS = 256  # steps (loggings of a step) per block
# A block never spans more steps than this, so a step-range read finds its blocks on the
# (job, first_step) index between low - span and high (brakeline_points relies on it).
BLOCK_STEP_SPAN = 65_536
# Metrics × columns of one block at most: a job logging hundreds of metrics a step (per-layer
# gradient norms) gets narrower blocks, never a grid of millions of mostly absent cells.
BLOCK_CELLS = 65_536
BATCH_POINTS = 200_000  # per transaction: bounded lock time and memory
_DELTA_LIMIT = 2**31 - 1  # microseconds a point's time may lie from its column's (int4)
_MICROSECOND = timedelta(microseconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

COPY_BLOCKS_SQL = (
    f"COPY {BLOCKS} (job_id, rank, node, first_step, last_step, first_time, last_time, "
    "last_id, names, steps, times, vals, tdelta) FROM STDIN (FORMAT BINARY)"
)
COPY_BLOCK_TYPES = [
    "int8", "int4", "varchar", "int8", "int8", "timestamptz", "timestamptz", "int8",
    "varchar[]", "int8[]", "timestamptz[]", "float8[]", "int4[]",
]  # fmt: skip

# Jobs with points both cursors are past and not compacted yet.
_DUE_SQL = f"""
SELECT e.job_id, least(e.cursor, r.cursor), coalesce(c.cursor, 0), j.last_metric_at
FROM {EVALUATION} e JOIN {ROLLUP_CURSORS} r ON r.job_id = e.job_id
JOIN {JOBS} j ON j.id = e.job_id
LEFT JOIN {COMPACTION} c ON c.job_id = e.job_id
WHERE least(e.cursor, r.cursor) > coalesce(c.cursor, 0)
ORDER BY e.job_id
"""

# The oldest point not compacted yet (its time, which ingest keeps within a day of the server's).
_OLDEST_SQL = f"SELECT time FROM {POINTS} WHERE job_id = %s AND id > %s ORDER BY id LIMIT 1"

_READ_SQL = f"""
SELECT id, name, step, (extract(epoch FROM time) * 1000000)::int8, value, node, rank
FROM {POINTS}
WHERE job_id = %s AND id > %s AND id <= %s ORDER BY id LIMIT %s
"""


class Conflict(Exception):
    """Another round compacted (or retention deleted) some of these points first."""


@dataclass
class _Column:
    step: int
    time: int  # microseconds since the epoch (exact: times are parsed once, as integers)
    values: dict[str, tuple[float, int]] = field(default_factory=dict)  # name → (value, µs)


@dataclass
class Block:
    rank: int
    node: str | None
    columns: list[_Column]
    last_id: int

    def row(self, job_id: int) -> tuple[Any, ...]:
        names = sorted({name for column in self.columns for name in column.values})
        absent = (None, None)
        vals = [[c.values.get(name, absent)[0] for c in self.columns] for name in names]
        deltas = [[c.values.get(name, absent)[1] for c in self.columns] for name in names]
        shifted = any(d for row in deltas for d in row)
        times = [moment(c.time) for c in self.columns]
        listed = [c.step for c in self.columns]
        # Contiguous, each once (the usual case): NULL, and brakeline_points regenerates them.
        steps = None if listed == list(range(listed[0], listed[0] + len(listed))) else listed
        point_times = [c.time + delta for c in self.columns for _, delta in c.values.values()]
        return (
            job_id, self.rank, self.node, self.columns[0].step, self.columns[-1].step,
            moment(min(point_times)), moment(max(point_times)), self.last_id, names,
            steps, times, vals, deltas if shifted else None,
        )  # fmt: skip


def moment(microseconds: int) -> datetime:
    return EPOCH + microseconds * _MICROSECOND


def _columns(points: list[tuple]) -> list[_Column]:
    """One rank's points (id order) as columns in step order: a column holds each metric at
    most once, so a step logged again (a restart re-logging it) opens a second column for it."""
    by_key: dict[tuple[int, int], _Column] = {}
    # The first column each (metric, step) may still go in: a rank logging one metric at one
    # step a million times (hostile, or a loop gone wrong) costs a million steps, not 10¹².
    free: dict[tuple[str, int], int] = {}
    for _, name, step, time, value, _, _ in points:
        k = free.get((name, step), 0)
        while True:
            column = by_key.get((step, k))
            if column is None:
                by_key[(step, k)] = _Column(step, time, {name: (value, 0)})
                break
            delta = time - column.time
            if name not in column.values and -_DELTA_LIMIT <= delta <= _DELTA_LIMIT:
                column.values[name] = (value, delta)
                break
            k += 1
        free[(name, step)] = k + 1
    return [by_key[key] for key in sorted(by_key)]


def blocks_of(points: list[tuple]) -> list[Block]:
    """Points ``(id, name, step, µs since the epoch, value, node, rank)`` in id order → blocks,
    each of one
    rank and node, at most ``BLOCK_COLUMNS`` columns, less than ``BLOCK_STEP_SPAN`` steps and
    at most ``BLOCK_CELLS`` metrics × columns (a single column may hold more)."""
    groups: dict[tuple[int, str | None], list[tuple]] = {}
    for point in points:
        groups.setdefault((point[6], point[5]), []).append(point)
    blocks = []
    for (rank, node), members in groups.items():
        last_id = max(p[0] for p in members)
        current: list[_Column] = []
        names: set[str] = set()
        for column in _columns(members):
            if current and (
                len(current) == BLOCK_COLUMNS
                or column.step - current[0].step >= BLOCK_STEP_SPAN
                or len(names.union(column.values)) * (len(current) + 1) > BLOCK_CELLS
            ):
                blocks.append(Block(rank, node, current, last_id))
                current, names = [], set()
            current.append(column)
            names.update(column.values)
        blocks.append(Block(rank, node, current, last_id))
    return blocks


def _compact_chunk(job_id: int, after: int, bound: int) -> tuple[int, int]:
    """Compact up to ``BATCH_POINTS`` points of the job above ``after`` and at most ``bound``;
    returns (points compacted, the cursor reached). Raises Conflict when another round won."""
    # Read before the transaction: no point is ever committed at or below the bound later, and
    # none is updated, so the only change until the DELETE is a deletion (another round, or
    # retention) — which the DELETE's count catches. The blocks' day partitions are created
    # in between, outside the transaction: creating one locks the table, briefly.
    with connection.cursor() as cursor:
        cursor.execute(_READ_SQL, [job_id, after, bound, BATCH_POINTS])
        points = cursor.fetchall()
    if not points:
        return 0, bound
    high = bound if len(points) < BATCH_POINTS else points[-1][0]
    rows = [block.row(job_id) for block in blocks_of(points)]
    partitions.ensure(min(row[5] for row in rows), max(row[5] for row in rows))
    with transaction.atomic(), connection.cursor() as cursor:
        with cursor.cursor.copy(COPY_BLOCKS_SQL) as copy:
            copy.set_types(COPY_BLOCK_TYPES)
            for row in rows:
                copy.write_row(row)
        cursor.execute(
            f"DELETE FROM {POINTS} WHERE job_id = %s AND id > %s AND id <= %s",
            [job_id, after, high],
        )
        if cursor.rowcount != len(points):
            raise Conflict(f"job {job_id}: {cursor.rowcount} rows deleted, {len(points)} read")
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
    with connection.cursor() as cursor:
        cursor.execute(_OLDEST_SQL, [job_id, after])
        row = cursor.fetchone()
    return row is not None and row[0] < since


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
        try:
            done[job_id] = compact_job(job_id, after, bound)
        except (Conflict, ValueError) as skipped:
            log.info("compaction of job %s skipped: %s", job_id, skipped)
    return done
