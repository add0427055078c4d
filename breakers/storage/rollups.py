"""Merge metric points into 10 s and 1 min rollups per rank, exactly once per point.

Each job has a high-water mark (``RollupCursor``): the points with a greater id are merged into
their buckets by one ``INSERT … SELECT … ON CONFLICT DO UPDATE`` that *combines* (sums counts,
keeps the lesser min and the greater max with their steps, the later last), and the cursor
advances in the same transaction. Ingest of one job commits in id order (a row lock on the
job, ``breakers.agent.store``), so a point below the cursor is never committed later: no point
is merged twice or skipped. Points are read by id range through ``brakeline_points_after``
(raw rows and ingest's blocks alike; ``breakers.storage.points``). A merge, not a
recomputation, so a bucket stays right after retention deleted its raw points.

Only plain SQL through the calling thread's own ``django.db.connection``: no cached cursor, no
connection handling of its own (the task runs inside the test process's worker thread too).
"""

from __future__ import annotations

from django.db import connection, transaction

from breakers.control.duties import per_job
from breakers.models import MetricBlock, MetricPoint, MetricRollup, RollupCursor
from breakers.storage.points import next_chunk
from incidents.models import Job

POINTS = MetricPoint._meta.db_table
BLOCKS = MetricBlock._meta.db_table
ROLLUPS = MetricRollup._meta.db_table
CURSORS = RollupCursor._meta.db_table
JOBS = Job._meta.db_table
WIDTHS = (10, 60)  # seconds
BATCH_POINTS = 200_000  # per transaction: bounded lock time and memory
FINITE = "p.value NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)"

# The bucket's last value: the point with the highest (step, id) — ARRAY max carries it along.
_MERGE_SQL = f"""
INSERT INTO {ROLLUPS} AS r (job_id, name, rank, seconds, bucket, first_step, last_step,
  last_value, count, total, squares, min_value, min_step, max_value, max_step,
  nan_count, nan_step, pos_inf_count, pos_inf_step, neg_inf_count, neg_inf_step)
SELECT %(job)s::bigint, p.name, p.rank, w.seconds,
  to_timestamp(floor(date_part('epoch', p.time) / w.seconds) * w.seconds),
  min(p.step),
  (max(ARRAY[p.step::float8, p.id::float8, p.value]))[1]::bigint,
  (max(ARRAY[p.step::float8, p.id::float8, p.value]))[3],
  count(*) FILTER (WHERE {FINITE}),
  coalesce(sum(p.value) FILTER (WHERE {FINITE}), 0),
  coalesce(sum(p.value * p.value) FILTER (WHERE {FINITE}), 0),
  (min(ARRAY[p.value, p.step::float8]) FILTER (WHERE {FINITE}))[1],
  (min(ARRAY[p.value, p.step::float8]) FILTER (WHERE {FINITE}))[2]::bigint,
  (max(ARRAY[p.value, -p.step::float8]) FILTER (WHERE {FINITE}))[1],
  (-(max(ARRAY[p.value, -p.step::float8]) FILTER (WHERE {FINITE}))[2])::bigint,
  count(*) FILTER (WHERE p.value = 'NaN'::float8),
  min(p.step) FILTER (WHERE p.value = 'NaN'::float8),
  count(*) FILTER (WHERE p.value = 'Infinity'::float8),
  min(p.step) FILTER (WHERE p.value = 'Infinity'::float8),
  count(*) FILTER (WHERE p.value = '-Infinity'::float8),
  min(p.step) FILTER (WHERE p.value = '-Infinity'::float8)
FROM brakeline_points_after(%(job)s, %(cursor)s, %(high)s) p
CROSS JOIN (VALUES (10), (60)) AS w(seconds)
GROUP BY 1, 2, 3, 4, 5
ON CONFLICT (job_id, name, rank, seconds, bucket) DO UPDATE SET
  first_step = least(r.first_step, excluded.first_step),
  last_step = CASE WHEN excluded.last_step >= r.last_step
                   THEN excluded.last_step ELSE r.last_step END,
  last_value = CASE WHEN excluded.last_step >= r.last_step
                    THEN excluded.last_value ELSE r.last_value END,
  count = r.count + excluded.count,
  total = r.total + excluded.total,
  squares = r.squares + excluded.squares,
  min_value = CASE WHEN r.min_value IS NULL OR excluded.min_value < r.min_value
                   THEN excluded.min_value ELSE r.min_value END,
  min_step = CASE WHEN r.min_value IS NULL OR excluded.min_value < r.min_value
                  THEN excluded.min_step ELSE r.min_step END,
  max_value = CASE WHEN r.max_value IS NULL OR excluded.max_value > r.max_value
                   THEN excluded.max_value ELSE r.max_value END,
  max_step = CASE WHEN r.max_value IS NULL OR excluded.max_value > r.max_value
                  THEN excluded.max_step ELSE r.max_step END,
  nan_count = r.nan_count + excluded.nan_count,
  nan_step = least(r.nan_step, excluded.nan_step),
  pos_inf_count = r.pos_inf_count + excluded.pos_inf_count,
  pos_inf_step = least(r.pos_inf_step, excluded.pos_inf_step),
  neg_inf_count = r.neg_inf_count + excluded.neg_inf_count,
  neg_inf_step = least(r.neg_inf_step, excluded.neg_inf_step)
"""

# Jobs with points past their cursor: a probe of each (job, id) index per job.
_PENDING_SQL = f"""
SELECT j.id FROM {JOBS} j LEFT JOIN {CURSORS} c ON c.job_id = j.id
WHERE EXISTS (SELECT 1 FROM {POINTS} p WHERE p.job_id = j.id AND p.id > coalesce(c.cursor, 0))
   OR EXISTS (SELECT 1 FROM {BLOCKS} b
              WHERE b.job_id = j.id AND b.last_id > coalesce(c.cursor, 0))
ORDER BY j.id
"""


def supported() -> bool:
    """Rollups are PostgreSQL's; the embedded SQLite demo charts from raw points only."""
    return connection.vendor == "postgresql"


def roll_up_batch(job_id: int, limit: int = BATCH_POINTS) -> int:
    """Merge up to ``limit`` points past the job's cursor; the number merged (0: caught up)."""
    RollupCursor.objects.get_or_create(job_id=job_id)
    with transaction.atomic(), connection.cursor() as cursor:
        # The lock: a second roll-up of this job waits here, then reads the advanced cursor.
        mark = RollupCursor.objects.select_for_update().get(job_id=job_id)
        cursor.execute("SET LOCAL jit = off")
        high, merged, _ = next_chunk(job_id, mark.cursor, limit)
        if high is None:
            return 0
        cursor.execute(_MERGE_SQL, {"job": job_id, "cursor": mark.cursor, "high": high})
        RollupCursor.objects.filter(job_id=job_id).update(cursor=high)
    return int(merged)


def roll_up_job(job_id: int, max_batches: int = 25) -> int:
    """Merge the job's pending points, a bounded number of batches per call (the beat calls
    again: a backlog of 100M points is not one transaction)."""
    merged = 0
    for _ in range(max_batches):
        done = roll_up_batch(job_id)
        merged += done
        if done == 0:
            break
    return merged


def roll_up_all() -> dict[int, int]:
    """Every job with points past its cursor → points merged now. Each job on its own
    (``per_job``): one job whose points cannot be merged is logged and counted, and the
    others are rolled up all the same."""
    if not supported():
        return {}
    with connection.cursor() as cursor:
        cursor.execute(_PENDING_SQL)
        jobs = [row[0] for row in cursor.fetchall()]
    merged: dict[int, int] = {}
    for job_id in jobs:
        with per_job("roll_up", job_id, savepoint=False):
            merged[job_id] = roll_up_job(job_id)
    return merged
