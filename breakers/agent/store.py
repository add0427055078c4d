"""Writing a validated metrics batch: one statement per batch, whole or not at all."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import NamedTuple

from django.db import connection, transaction
from django.utils import timezone

from breakers.agent.protocol import PointIn
from breakers.models import MetricBatch, MetricPoint
from incidents.jobs import advance_current_step, mark_job_running
from incidents.models import Node

COPY_METRICS_SQL = (
    f"COPY {MetricPoint._meta.db_table} (job_id, name, step, time, value, node, rank) "
    "FROM STDIN (FORMAT BINARY)"
)
COPY_METRICS_TYPES = ["int8", "varchar", "int8", "timestamptz", "float8", "varchar", "int4"]
# Node names already registered, per job: registering is idempotent, this only spares the
# INSERT on every batch of a job whose nodes are all known (it is a cache, never the truth).
_known_nodes: dict[int, set[str]] = {}


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


def _copy_points(job_id: int, points: Sequence[PointIn], received_at: datetime) -> None:
    with connection.cursor() as cursor:
        copy_rows(
            cursor.cursor,
            (
                (job_id, p.name, p.step, p.time or received_at, p.value, p.node, p.rank)
                for p in points
            ),
        )


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


def _record_batch(job_id: int, batch_id: str, accepted: int, received_at: datetime) -> int | None:
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
) -> Stored:
    """Store a validated batch atomically, once per ``batch_id`` (None: protocol 1, every call
    stores). A batch id seen before writes nothing and answers what the first copy stored."""
    received_at = received_at or timezone.now()
    with transaction.atomic():
        # This UPDATE comes first on purpose: its row lock serialises ingest per job (not across
        # jobs), so point ids of one job grow in commit order and the evaluator can walk them
        # with a simple cursor. It also orders two copies of one batch sent at once.
        advance_current_step(
            job_id, max((p.step for p in points), default=None), last_metric_at=received_at
        )
        if batch_id is not None:
            earlier = _record_batch(job_id, batch_id, len(points), received_at)
            if earlier is not None:
                return Stored(earlier, duplicate=True)
        if points:
            if connection.vendor == "postgresql":
                _copy_points(job_id, points, received_at)
            else:
                _insert_points(job_id, points, received_at)
            _register_nodes(job_id, {p.node for p in points if p.node})
        if job_is_pending:
            mark_job_running(job_id)
    return Stored(len(points), duplicate=False)
