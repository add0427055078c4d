"""A job's points by id: the chunks the id-cursor readers walk, raw rows and blocks as one.

The evaluator, the rollups and compaction each keep a cursor, the greatest point id they are
past. Ingest writes a batch on PostgreSQL as one block per rank and node whose ``last_id`` is
the next id of the raw points' sequence; a job's batches commit concurrently, so a chunk ends
at or below the job's **horizon** (``breakers.storage.writers``): no batch can commit an id at
or below it any more, so no cursor ever passes a point committed later. A block is read whole
(its points share its id), so a chunk always ends on a block's edge. The embedded SQLite mode
has only raw rows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import NamedTuple

from django.db import connection

from breakers.models import MetricBlock, MetricPoint
from breakers.storage.writers import horizon

POINTS = MetricPoint._meta.db_table
BLOCKS = MetricBlock._meta.db_table
# SQLite: points in id order, each its own id.
_SQLITE_HIGH = (
    f"SELECT max(id), count(*) FROM (SELECT id FROM {POINTS} WHERE job_id = %s AND id > %s "
    "ORDER BY id LIMIT %s) AS chunk"
)


class Chunk(NamedTuple):
    high: int | None  # the greatest id of the chunk (None: nothing above the cursor)
    points: int
    more: bool  # more points follow the chunk


# The greatest id of the job's raw rows and blocks in (after, horizon].
_HIGH_BELOW_SQL = f"""
SELECT greatest(
  (SELECT max(id) FROM {POINTS} WHERE job_id = %(job)s AND id > %(after)s AND id <= %(cap)s),
  (SELECT max(last_id) FROM {BLOCKS}
   WHERE job_id = %(job)s AND last_id > %(after)s AND last_id <= %(cap)s))
"""


def next_chunk(job_id: int, after: int, limit: int) -> Chunk:
    """The job's next chunk above ``after``: at most ``limit`` points (or one block holding
    more), ending on a block's edge and at or below the job's horizon (``more`` when points
    above the horizon are already visible: a reader comes back for them)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cap = horizon(job_id)
            cursor.execute("SELECT * FROM brakeline_pending(%s, %s, %s)", [job_id, after, limit])
            high, points, more = cursor.fetchone()
            if high is None or cap is None or high <= cap:
                return Chunk(high, int(points), bool(more))
            cursor.execute(_HIGH_BELOW_SQL, {"job": job_id, "after": after, "cap": cap})
            capped = cursor.fetchone()[0]
            return Chunk(capped, int(points), True) if capped else Chunk(None, 0, False)
        cursor.execute(_SQLITE_HIGH, [job_id, after, limit + 1])
        high, count = cursor.fetchone()
        if count > limit:  # one too many was read to know more follow: the chunk ends before
            cursor.execute(
                f"SELECT max(id) FROM (SELECT id FROM {POINTS} WHERE job_id = %s AND id > %s "
                "ORDER BY id LIMIT %s) AS chunk",
                [job_id, after, limit],
            )
            return Chunk(cursor.fetchone()[0], limit, True)
        return Chunk(high, int(count), False)


# The first raw row or ingest's first block above a cursor: its time (a block's earliest).
_OLDEST_SQL = f"""
SELECT min(t) FROM (
  (SELECT time FROM {POINTS} WHERE job_id = %(job)s AND id > %(after)s ORDER BY id LIMIT 1)
  UNION ALL
  (SELECT first_time FROM {BLOCKS} WHERE job_id = %(job)s AND last_id > %(after)s
   ORDER BY last_id LIMIT 1)
) AS oldest(t)
"""


def oldest_after(job_id: int, after: int) -> datetime | None:
    """The time of the job's first point (by id) above ``after``: how far behind a cursor is."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_OLDEST_SQL, {"job": job_id, "after": after})
        else:
            cursor.execute(
                f"SELECT time FROM {POINTS} WHERE job_id = %s AND id > %s ORDER BY id LIMIT 1",
                [job_id, after],
            )
        row = cursor.fetchone()
    if row is None or row[0] is None:
        return None
    moment = row[0]
    if isinstance(moment, str):  # SQLite's raw cursor gives text
        moment = datetime.fromisoformat(moment)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class StoredPoint(NamedTuple):
    id: int
    name: str
    step: int
    time: datetime
    value: float
    node: str | None
    rank: int


def stored_points(job_id: int, name: str | None = None) -> list[StoredPoint]:
    """Every point of the job (of one metric), in id then step order — for tests, benchmarks
    and small jobs; charts read buckets (``breakers.storage.buckets``), never this."""
    where = "" if name is None else " WHERE name = %s"
    params: list = [] if name is None else [name]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT id, name, step, time, value, node, rank "
                f"FROM brakeline_points_after(%s, 0, 9223372036854775807){where} "
                "ORDER BY id, step",
                [job_id, *params],
            )
            return [StoredPoint(*row) for row in cursor.fetchall()]
    rows = MetricPoint.objects.filter(job_id=job_id, **({} if name is None else {"name": name}))
    fields = ("id", "name", "step", "time", "value", "node", "rank")
    return [StoredPoint(*row) for row in rows.order_by("id").values_list(*fields)]


def first_point(job_id: int, name: str) -> StoredPoint | None:
    """The series' point at its lowest step (the earliest logged of that step)."""
    if connection.vendor != "postgresql":
        row = (
            MetricPoint.objects.filter(job_id=job_id, name=name)
            .order_by("step", "time")
            .values_list("id", "name", "step", "time", "value", "node", "rank")
            .first()
        )
        return None if row is None else StoredPoint(*row)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, %s, step, time, value, node, rank "
            "FROM brakeline_points(%s, %s, 0, 9223372036854775807) ORDER BY step, time LIMIT 1",
            [name, job_id, name],
        )
        row = cursor.fetchone()
    return None if row is None else StoredPoint(*row)


def any_points_stored() -> bool:
    """Whether any job has a point (a raw row or a block)."""
    return MetricPoint.objects.exists() or MetricBlock.objects.exists()
