"""Writing a validated metrics batch: one statement per batch, whole or not at all.

On PostgreSQL a batch becomes one ``MetricBlock`` per rank and node (``COPY`` of a few rows of
arrays: ~8 bytes a point instead of a ~200-byte row with three index entries, and the largest
single cost of ingest, PostgreSQL's per-row insert, gone). The embedded SQLite mode stores one
``MetricPoint`` row per point.
"""

from __future__ import annotations

import time as clock
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import NamedTuple, TypeVar

import psycopg
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from breakers.agent.protocol import PointIn
from breakers.models import CompactionCursor, MetricBatch, MetricPoint
from breakers.storage import partitions
from breakers.storage.blocks import batch_rows, blocks_of, to_microseconds
from breakers.storage.writers import announce_writer
from incidents.jobs import advance_current_step, mark_job_running
from incidents.models import Node

COPY_METRICS_SQL = (
    f"COPY {MetricPoint._meta.db_table} (job_id, name, step, time, value, node, rank) "
    "FROM STDIN (FORMAT BINARY)"
)
COPY_METRICS_TYPES = ["int8", "varchar", "int8", "timestamptz", "float8", "varchar", "int4"]
COPY_BLOCKS_SQL, COPY_BLOCK_TYPES = partitions.copy_blocks(with_last_id=False)
# Node and metric names already registered, per job: registering is idempotent, these only
# spare a write on every batch of a job whose names are all known (caches, never the truth).
_known_nodes: dict[int, set[str]] = {}
_known_names: dict[int, set[str]] = {}
# Day partitions of the blocks seen to exist, and when: retention may drop an old day, so the
# knowledge expires (a point's time is within a day of now, far inside the raw window).
_known_days: dict[object, float] = {}
_DAY_KNOWN_SECONDS = 300.0


def copy_rows(psycopg_cursor, rows: Iterable[tuple]) -> None:
    """COPY (job_id, name, step, time, value, node, rank) rows through a raw psycopg 3 cursor.

    psycopg 3's COPY streams the batch in one statement instead of one INSERT per point, the
    physical limit of what PostgreSQL takes in (bench/ingest.py measures both side by side).
    Binary format: no text formatting of floats and timestamps on either side.
    """
    with psycopg_cursor.copy(COPY_METRICS_SQL) as copy:
        copy.set_types(COPY_METRICS_TYPES)
        for row in rows:
            copy.write_row(row)


def _block_rows(job_id: int, points: Sequence[PointIn], received_at: datetime) -> list[tuple]:
    """The batch as block rows, one per rank and node (more for a batch of > 256 steps)."""
    rows = batch_rows(job_id, points, received_at)
    if rows is not None:
        return rows
    received = to_microseconds(received_at)
    seen: dict[datetime, int] = {}  # a step's metrics share one time: convert it once
    shaped = []
    for index, p in enumerate(points):
        if p.time is None:
            at = received
        elif (known := seen.get(p.time)) is not None:
            at = known
        else:
            at = seen[p.time] = to_microseconds(p.time)
        shaped.append((index, p.name, p.step, at, p.value, p.node, p.rank))
    rows = [block.row(job_id) for block in blocks_of(shaped)]
    return [row[:7] + row[8:] for row in rows]  # without last_id: the sequence gives it


def _ensure_days(rows: list[tuple]) -> None:
    """Create the blocks' day partitions before the batch's transaction (creating one locks
    the table: never inside ingest's transaction, which holds the job's row lock)."""
    now = clock.monotonic()
    first = min(row[5] for row in rows)
    last = max(row[5] for row in rows)
    days = {first.date(), last.date()}
    if all(now - _known_days.get(day, -_DAY_KNOWN_SECONDS) < _DAY_KNOWN_SECONDS for day in days):
        return
    partitions.ensure(first, last)
    _known_days.update(dict.fromkeys(days, now))


def _copy_blocks(rows: list[tuple]) -> None:
    with connection.cursor() as cursor, cursor.cursor.copy(COPY_BLOCKS_SQL) as copy:
        copy.set_types(COPY_BLOCK_TYPES)
        for row in rows:
            copy.write_row(row)


def _register_names(job_id: int, names: set[str]) -> None:
    """Record metric names the job had not logged before: its series list (the chart page's)
    without scanning its blocks."""
    known = _known_names.setdefault(job_id, set())
    new = names - known
    if not new:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {CompactionCursor._meta.db_table} AS c "
            "(job_id, cursor, names, points, updated_at) "
            "VALUES (%s, 0, to_jsonb(%s::text[]), 0, now()) ON CONFLICT (job_id) DO UPDATE "
            "SET names = (SELECT jsonb_agg(n ORDER BY n) FROM ("
            "SELECT jsonb_array_elements_text(c.names) UNION SELECT unnest(%s::text[])) AS u(n))",
            [job_id, sorted(new), sorted(new)],
        )
    transaction.on_commit(lambda: known.update(new))


def _insert_points(job_id: int, points: Sequence[PointIn], received_at: datetime) -> None:
    MetricPoint.objects.bulk_create(
        [
            MetricPoint(
                job_id=job_id,
                name=p.name,
                step=p.step,
                time=p.time or received_at,
                value=p.value,
                node=p.node,
                rank=p.rank,
            )
            for p in points
        ],
        batch_size=500,
    )


def _register_nodes(job_id: int, hostnames: set[str]) -> None:
    known = _known_nodes.setdefault(job_id, set())
    new = hostnames - known
    if new:
        Node.objects.bulk_create(
            [Node(job_id=job_id, hostname=name) for name in sorted(new)],
            ignore_conflicts=True,
        )
        # Only remembered once the batch commits: a rolled-back insert must be retried.
        transaction.on_commit(lambda: known.update(new))


class Stored(NamedTuple):
    accepted: int
    duplicate: bool  # the batch id was stored before: nothing was written this time


RECORD_BATCH_SQL = (
    f"INSERT INTO {MetricBatch._meta.db_table} (job_id, batch_id, accepted, received_at) "
    "VALUES (%s, %s, %s, %s) ON CONFLICT (job_id, batch_id) DO NOTHING"
)


def claim_batch(job_id: int, batch_id: str, accepted: int, received_at: datetime) -> int | None:
    """Claim the batch id inside the batch's transaction: None when claimed now, else the
    number of points the first copy stored. A concurrent copy of the same batch blocks on the
    unique index until the first commits (then sees its row) or rolls back (then claims it)."""
    with connection.cursor() as cursor:
        cursor.execute(RECORD_BATCH_SQL, [job_id, batch_id, accepted, received_at])
        if cursor.rowcount == 1:
            return None
    return (
        MetricBatch.objects.filter(job_id=job_id, batch_id=batch_id)
        .values_list("accepted", flat=True)
        .get()
    )


CLAIM_BATCHES_SQL = (
    f"INSERT INTO {MetricBatch._meta.db_table} (job_id, batch_id, accepted, received_at) "
    "SELECT %s, b, a, %s FROM unnest(%s::text[], %s::int[]) AS u(b, a) "
    "ON CONFLICT (job_id, batch_id) DO NOTHING RETURNING batch_id"
)


def claim_batches(
    job_id: int, claims: dict[str, int], received_at: datetime
) -> dict[str, int | None]:
    """``claim_batch`` for several batches (batch id → its points) in one statement: for each
    id, None when claimed now, else the number of points its first copy stored."""
    if not claims:
        return {}
    ids = list(claims)
    with connection.cursor() as cursor:
        cursor.execute(CLAIM_BATCHES_SQL, [job_id, received_at, ids, list(claims.values())])
        claimed = {row[0] for row in cursor.fetchall()}
    taken = [batch_id for batch_id in ids if batch_id not in claimed]
    earlier = dict(
        MetricBatch.objects.filter(job_id=job_id, batch_id__in=taken).values_list(
            "batch_id", "accepted"
        )
        if taken
        else ()
    )
    return {batch_id: None if batch_id in claimed else earlier[batch_id] for batch_id in ids}


def store_points(
    job_id: int,
    points: Sequence[PointIn],
    received_at: datetime | None = None,
    *,
    job_is_pending: bool = True,
) -> int:
    """Store a validated batch for ``job_id`` atomically; returns the number stored."""
    return store_batch(job_id, points, None, received_at, job_is_pending=job_is_pending).accepted


def store_batch(
    job_id: int,
    points: Sequence[PointIn],
    batch_id: str | None,
    received_at: datetime | None = None,
    *,
    job_is_pending: bool = True,
    then: Callable[[], object] | None = None,
) -> Stored:
    """Store a validated batch atomically, once per ``batch_id`` (None: protocol 1, every call
    stores). A batch id seen before writes nothing and answers what the first copy stored.
    ``then`` runs inside the batch's transaction once its points are written (never for a
    batch stored before): what rides in the batch commits with it or not at all."""
    received_at = received_at or timezone.now()
    blocks = prepare_blocks(job_id, points, received_at)
    return on_dropped_partition(
        blocks,
        lambda: _write(job_id, points, blocks, batch_id, received_at, job_is_pending, then),
    )


def prepare_blocks(
    job_id: int, points: Sequence[PointIn], received_at: datetime
) -> list[tuple] | None:
    """The batch's block rows (PostgreSQL; None: stored as rows), their day partitions made
    sure of — before the batch's transaction, which must not lock the table."""
    if not points or connection.vendor != "postgresql":
        return None
    blocks = _block_rows(job_id, points, received_at)
    _ensure_days(blocks)
    return blocks


T = TypeVar("T")


def on_dropped_partition(blocks: list[tuple] | None, write: Callable[[], T]) -> T:
    """Run ``write`` (a whole transaction); once more when a day partition this process knew
    of was dropped since (retention, or a rolled-back transaction that created it): the write
    rolled back whole, the partition is made, and it stores again."""
    try:
        return write()
    except (IntegrityError, psycopg.errors.CheckViolation) as error:  # COPY's is psycopg's own
        if not blocks or "no partition" not in str(error):
            raise
        _known_days.clear()
        _ensure_days(blocks)
        return write()


def _write(
    job_id: int,
    points: Sequence[PointIn],
    blocks: list[tuple] | None,
    batch_id: str | None,
    received_at: datetime,
    job_is_pending: bool,
    then: Callable[[], object] | None = None,
) -> Stored:
    with transaction.atomic():
        if batch_id is not None:
            earlier = claim_batch(job_id, batch_id, len(points), received_at)
            if earlier is not None:
                return Stored(earlier, duplicate=True)
        write_points(job_id, points, blocks, received_at, job_is_pending=job_is_pending)
        if then is not None:
            then()
    return Stored(len(points), duplicate=False)


def write_points(
    job_id: int,
    points: Sequence[PointIn],
    blocks: list[tuple] | None,
    received_at: datetime,
    *,
    job_is_pending: bool,
) -> None:
    """Write claimed points — one batch's, or several batches' at once (a node's bundle) —
    inside the caller's transaction: one COPY of their blocks, their names and nodes, and the
    job's step."""
    if blocks:
        # Before any point id is taken: the cursor readers' horizon waits for these points
        # (breakers.storage.writers). Shared: the job's batches never wait for each other.
        announce_writer(job_id)
        _copy_blocks(blocks)
        _register_names(job_id, {p.name for p in points})
    elif points:
        _insert_points(job_id, points, received_at)
    if points:
        _register_nodes(job_id, {p.node for p in points if p.node})
    # Last, and only when the points move the job's step or its metric time is stale: the
    # job's row is locked from this UPDATE to the commit, and points that change nothing on
    # it take no lock (a thousand ranks at one step update it once per step).
    advance_current_step(
        job_id, max((p.step for p in points), default=None), last_metric_at=received_at
    )
    if job_is_pending:
        mark_job_running(job_id)
