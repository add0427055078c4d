"""One grouped scan of a series into buckets of whole steps: of the raw points, or of the
rollups of one width. A bucket keeps its finite minimum and maximum *at the steps where they
occurred* (min/max downsampling: every spike and dip survives), its first NaN, +Inf and -Inf as
points of their own, and count/Σx/Σx² (the loss band). ``min(ARRAY[value, step, epoch])``
carries the arg-min along without a sort.

``rank``: one rank's series, or None for every rank at once (the spread across ranks).
Raw points are read through ``brakeline_points`` (raw rows and compacted blocks as one set,
``breakers.storage.compaction``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from breakers.models import MetricPoint, MetricRollup

TABLE = MetricPoint._meta.db_table
ROLLUPS = MetricRollup._meta.db_table
FINITE = "value NOT IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8)"
RANK = " AND rank = %(rank)s"

_RAW_SQL = f"""
SELECT (step - %(origin)s) / %(width)s AS bucket,
  min(ARRAY[value, step, date_part('epoch', time)]) FILTER (WHERE {FINITE}),
  max(ARRAY[value, step, date_part('epoch', time)]) FILTER (WHERE {FINITE}),
  count(*) FILTER (WHERE {FINITE}),
  sum(value) FILTER (WHERE {FINITE}),
  sum(value * value) FILTER (WHERE {FINITE}),
  min(ARRAY[step, date_part('epoch', time)]) FILTER (WHERE value = 'NaN'::float8),
  min(ARRAY[step, date_part('epoch', time)]) FILTER (WHERE value = 'Infinity'::float8),
  min(ARRAY[step, date_part('epoch', time)]) FILTER (WHERE value = '-Infinity'::float8)
FROM brakeline_points(%(job)s, %(name)s, %(low)s, %(high)s)
WHERE id > %(after)s{{rank}}
GROUP BY bucket ORDER BY bucket
"""

# The spread across every rank: only the finite extremes' values and the first step of each
# non-finite value, no arg-min arrays nor sums (at a thousand ranks every bucket groups a
# thousand points: half the time of _RAW_SQL, bench/ranks_console.py).
_SPREAD_SQL = f"""
SELECT (step - %(origin)s) / %(width)s AS bucket,
  min(value) FILTER (WHERE {FINITE}), max(value) FILTER (WHERE {FINITE}),
  min(step) FILTER (WHERE value = 'NaN'::float8),
  min(step) FILTER (WHERE value = 'Infinity'::float8),
  min(step) FILTER (WHERE value = '-Infinity'::float8)
FROM brakeline_points(%(job)s, %(name)s, %(low)s, %(high)s)
GROUP BY bucket ORDER BY bucket
"""

# The same row shape from the rollups: a bucket of whole steps groups the rollup rows whose
# first step falls in it; extremes keep their steps, times are their rollup bucket's start.
_ROLLUP_SQL = f"""
SELECT (first_step - %(origin)s) / %(width)s AS grid_bucket,
  min(ARRAY[min_value, min_step, date_part('epoch', bucket)]) FILTER (WHERE count > 0),
  max(ARRAY[max_value, max_step, date_part('epoch', bucket)]) FILTER (WHERE count > 0),
  sum(count), sum(total), sum(squares),
  min(ARRAY[nan_step, date_part('epoch', bucket)]) FILTER (WHERE nan_count > 0),
  min(ARRAY[pos_inf_step, date_part('epoch', bucket)]) FILTER (WHERE pos_inf_count > 0),
  min(ARRAY[neg_inf_step, date_part('epoch', bucket)]) FILTER (WHERE neg_inf_count > 0)
FROM {ROLLUPS}
WHERE job_id = %(job)s AND name = %(name)s AND seconds = %(seconds)s
  AND first_step BETWEEN %(low)s AND %(high)s{{rank}}
GROUP BY grid_bucket ORDER BY grid_bucket
"""


@dataclass
class Bucket:
    index: int
    points: list[tuple[int, float, float | str]]  # (step, epoch seconds, value), step order
    count: int  # finite points
    total: float
    squares: float

    def finite_range(self) -> tuple[float, float] | None:
        finite = [p[2] for p in self.points if isinstance(p[2], float) and math.isfinite(p[2])]
        return (min(finite), max(finite)) if finite else None


def bucket_from_row(row: tuple) -> Bucket:
    index, low, high, count, total, squares, nan, pos_inf, neg_inf = row
    points: dict[tuple[int, Any], tuple[int, float, float | str]] = {}
    for extreme in (low, high):
        if extreme is not None:
            value, step, epoch = extreme
            points[(int(step), value)] = (int(step), epoch, value)
    for marker, label in ((nan, "NaN"), (pos_inf, "Infinity"), (neg_inf, "-Infinity")):
        if marker is not None:
            points[(int(marker[0]), label)] = (int(marker[0]), marker[1], label)
    return Bucket(
        index=int(index),
        points=sorted(points.values(), key=lambda p: (p[0], p[1])),
        count=int(count or 0),
        total=float(total or 0.0),
        squares=float(squares or 0.0),
    )


def fetch_buckets(
    job_id: int,
    name: str,
    *,
    origin: int,
    width: int,
    low: int,
    high: int,
    rank: int | None = 0,
    seconds: int | None = None,
    after: int = 0,
) -> list[Bucket]:
    """One grouped scan between ``low`` and ``high`` (inclusive): of the raw points with an id
    above ``after``, or with ``seconds`` of the rollups of that width."""
    if connection.vendor != "postgresql":
        return _fetch_python(
            job_id, name, origin=origin, width=width, low=low, high=high, rank=rank
        )
    sql = _RAW_SQL if seconds is None else _ROLLUP_SQL
    params: dict[str, int | str | None] = {
        "origin": origin,
        "width": width,
        "job": job_id,
        "name": name,
        "low": low,
        "high": high,
        "after": after,
        "seconds": seconds,
        "rank": rank,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        # JIT compilation costs more than it saves on this one-pass aggregate (≈ +30 %).
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(sql.replace("{rank}", "" if rank is None else RANK), params)
        return [bucket_from_row(row) for row in cursor.fetchall()]


def fetch_spread(
    job_id: int, name: str, *, origin: int, width: int, low: int, high: int
) -> list[Bucket]:
    """Every rank's raw points between ``low`` and ``high`` as buckets holding only what the
    spread draws: the finite extremes' values (at the bucket's first step, their own steps
    unread) and each non-finite value's first step (its time unread)."""
    if connection.vendor != "postgresql":
        return _fetch_python(
            job_id, name, origin=origin, width=width, low=low, high=high, rank=None
        )
    params: dict[str, int | str] = {"origin": origin, "width": width, "job": job_id}
    params |= {"name": name, "low": low, "high": high}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL jit = off")
        cursor.execute(_SPREAD_SQL, params)
        rows = cursor.fetchall()
    buckets = []
    for index, least, most, nan, pos_inf, neg_inf in rows:
        start = origin + int(index) * width
        points: list[tuple[int, float, float | str]] = []
        if least is not None:
            points += [(start, 0.0, least), (start, 0.0, most)]
        for step, label in ((nan, "NaN"), (pos_inf, "Infinity"), (neg_inf, "-Infinity")):
            if step is not None:
                points.append((int(step), 0.0, label))
        buckets.append(Bucket(int(index), points, 0, 0.0, 0.0))
    return buckets


def _fetch_python(
    job_id: int, name: str, *, origin: int, width: int, low: int, high: int, rank: int | None
) -> list[Bucket]:
    """The embedded SQLite mode: the same buckets computed in Python (small demo runs)."""
    rows: dict[int, list] = {}
    points = MetricPoint.objects.filter(job_id=job_id, name=name, step__gte=low, step__lte=high)
    if rank is not None:
        points = points.filter(rank=rank)
    for step, time, value in points.values_list("step", "time", "value").iterator():
        rows.setdefault((step - origin) // width, []).append((step, time.timestamp(), value))
    buckets = []
    for index in sorted(rows):
        finite = [p for p in rows[index] if math.isfinite(p[2])]
        low_p = min(finite, key=lambda p: (p[2], p[0]), default=None)
        high_p = max(finite, key=lambda p: (p[2], p[0]), default=None)
        markers = []
        for test in (math.isnan, lambda v: v == math.inf, lambda v: v == -math.inf):
            hits = [p for p in rows[index] if test(p[2])]
            markers.append([min(hits)[0], min(hits)[1]] if hits else None)
        row = (
            index,
            [low_p[2], low_p[0], low_p[1]] if low_p else None,
            [high_p[2], high_p[0], high_p[1]] if high_p else None,
            len(finite),
            sum(p[2] for p in finite),
            sum(p[2] * p[2] for p in finite),
            *markers,
        )
        buckets.append(bucket_from_row(row))
    return buckets
