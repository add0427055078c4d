"""Where a chart's buckets come from: raw points inside the raw window, rollups beyond it.

A zoom (the range's buckets finer than what the 10 s rollups hold, inside the raw window) is
read from raw points; a full-range view of a long run from the coarsest rollups that still fill
the buckets asked for, min/max buckets so a spike is never averaged away. The raw points not
merged yet (id above the job's rollup cursor: the last seconds of ingest, raw rows or ingest's
blocks) are added to a rollup read, so each point is read from exactly one of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.db import connection

from breakers.models import MetricBlock
from breakers.storage.buckets import ROLLUPS, TABLE, Bucket, fetch_buckets, fetch_spread
from breakers.storage.rollups import CURSORS
from breakers.storage.rollups import supported as rollups_supported

BLOCKS = MetricBlock._meta.db_table
_ONE_SERIES = "job_id = %(job)s AND name = %(name)s AND seconds = 60"


@dataclass(frozen=True)
class Source:
    """Raw points (``seconds`` None) or the rollups of a width, plus the unmerged raw tail."""

    seconds: int | None
    cursor: int = 0  # with rollups: raw points with a greater id are read too,
    tail_step: int | None = None  # from this step on (None: there are none)

    @property
    def label(self) -> str:
        return "raw" if self.seconds is None else f"rollups-{self.seconds}s"


_RAW_RANGE_SQL = f"""
SELECT min(low), max(high) FROM (
  SELECT min(step), max(step) FROM {TABLE} WHERE job_id = %(job)s AND name = %(name)s
  UNION ALL
  SELECT (SELECT first_step FROM {BLOCKS} WHERE job_id = %(job)s AND names @> %(names)s::varchar[]
          ORDER BY first_step LIMIT 1),
         (SELECT max(last_step) FROM (SELECT last_step FROM {BLOCKS}
          WHERE job_id = %(job)s AND names @> %(names)s::varchar[]
          ORDER BY first_step DESC LIMIT 64) AS b)
) AS ranges(low, high)
"""


def raw_range(job_id: int, name: str) -> tuple[int, int] | None:
    """First and last step of the series' raw points (compacted ones to their block's bounds:
    a block holding the series may start or end a few steps before or after its points)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(_RAW_RANGE_SQL, {"job": job_id, "name": name, "names": [name]})
        else:
            cursor.execute(
                f"SELECT min(step), max(step) FROM {TABLE} WHERE job_id = %s AND name = %s",
                [job_id, name],
            )
        low, high = cursor.fetchone()
    return None if low is None else (int(low), int(high))


def rollup_range(job_id: int, name: str) -> tuple[int, int] | None:
    """First and last step merged into the job's rollups of a series (None: none yet)."""
    if not rollups_supported():
        return None
    with connection.cursor() as cursor:
        # Two probes of the (job, name, seconds, first_step) index, not a scan of the series.
        cursor.execute(
            f"SELECT (SELECT first_step FROM {ROLLUPS} WHERE {_ONE_SERIES} "
            "ORDER BY first_step LIMIT 1), "
            f"(SELECT max(last_step) FROM (SELECT last_step FROM {ROLLUPS} WHERE {_ONE_SERIES} "
            "ORDER BY first_step DESC LIMIT 64) AS newest)",
            {"job": job_id, "name": name},
        )
        low, high = cursor.fetchone()
    return None if low is None else (int(low), int(high))


def _rollup_rows(job_id: int, name: str, seconds: int, low: int, high: int, rank: int, cap: int):
    """How many rollup rows of one width and rank the range holds, counted up to ``cap``."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {ROLLUPS} WHERE job_id = %s AND name = %s "
            "AND seconds = %s AND first_step BETWEEN %s AND %s AND rank = %s LIMIT %s) AS r",
            [job_id, name, seconds, low, high, rank, cap],
        )
        return int(cursor.fetchone()[0])


def _unmerged(job_id: int, name: str) -> tuple[int, int | None]:
    """(the job's rollup cursor, the least step of the series' points above it, or of the
    first ingest block holding it): the points not merged yet, found on the (job, id) indexes —
    seconds of ingest, not the series."""
    with connection.cursor() as cursor:
        cursor.execute(
            # OFFSET 0 keeps min() from becoming "walk the series in step order until an id
            # above the cursor", which scans the whole series when there is none (1 s at 1M).
            f"SELECT c.cursor, least((SELECT min(step) FROM (SELECT step FROM {TABLE} "
            "WHERE job_id = %(job)s AND id > c.cursor AND name = %(name)s OFFSET 0) AS tail), "
            f"(SELECT min(first_step) FROM (SELECT first_step FROM {BLOCKS} "
            "WHERE job_id = %(job)s AND last_id > c.cursor AND names @> %(names)s::varchar[] "
            "OFFSET 0) AS tail_blocks)) "
            f"FROM {CURSORS} c WHERE c.job_id = %(job)s",
            {"job": job_id, "name": name, "names": [name]},
        )
        row = cursor.fetchone()
    if row is None:
        return 0, None
    return int(row[0]), None if row[1] is None else int(row[1])


def choose(
    job_id: int,
    name: str,
    raw: tuple[int, int] | None,
    rolled: tuple[int, int] | None,
    *,
    low: int,
    high: int,
    width: int,
    rank: int,
) -> Source:
    """Raw points when they reach back to ``low`` and the view is fine enough for them;
    otherwise the coarsest rollups that still give the buckets asked for."""
    raw_covers = raw is not None and raw[0] <= low
    if rolled is None or (width == 1 and raw_covers):
        return Source(None)
    wanted = max(1, (high - low + 1) // width)
    for seconds in (60, 10):
        if _rollup_rows(job_id, name, seconds, low, high, rank, cap=wanted) >= wanted:
            return Source(seconds, *_unmerged(job_id, name))
    if raw_covers:
        return Source(None)
    return Source(10, *_unmerged(job_id, name))


def read(job_id: int, name: str, source: Source, *, rank: int | None, **grid) -> list[Bucket]:
    """The buckets of one rank (None: every rank) on the grid, from ``source``."""
    if source.seconds is None:
        return fetch_buckets(job_id, name, rank=rank, **grid)
    rolled = fetch_buckets(job_id, name, rank=rank, seconds=source.seconds, **grid)
    if source.tail_step is None or source.tail_step > grid["high"]:
        return rolled
    tail_grid = {**grid, "low": max(grid["low"], source.tail_step)}
    tail = fetch_buckets(job_id, name, rank=rank, after=source.cursor, **tail_grid)
    return merge_buckets(rolled, tail)


def read_spread(job_id: int, name: str, source: Source, **grid) -> list[Bucket]:
    """Every rank's buckets on the grid for the spread: raw points by the lighter scan
    (``fetch_spread``), rollups as any read."""
    if source.seconds is None:
        return fetch_spread(job_id, name, **grid)
    return read(job_id, name, source, rank=None, **grid)


def merge_buckets(first: list[Bucket], second: list[Bucket]) -> list[Bucket]:
    """Buckets of one grid from two disjoint sets of points (rollups, then the raw tail not
    merged yet); a bucket present in both keeps the extremes and first markers of the two."""
    merged = {b.index: b for b in first}
    for bucket in second:
        other = merged.get(bucket.index)
        if other is None:
            merged[bucket.index] = bucket
            continue
        points = other.points + bucket.points
        finite = [p for p in points if isinstance(p[2], float) and math.isfinite(p[2])]
        kept = set()
        if finite:
            kept |= {min(finite, key=lambda p: p[2]), max(finite, key=lambda p: p[2])}
        for label in ("NaN", "Infinity", "-Infinity"):
            hits = [p for p in points if p[2] == label]
            if hits:
                kept.add(min(hits))
        merged[bucket.index] = Bucket(
            index=bucket.index,
            points=sorted(kept, key=lambda p: (p[0], p[1])),
            count=other.count + bucket.count,
            total=other.total + bucket.total,
            squares=other.squares + bucket.squares,
        )
    return [merged[i] for i in sorted(merged)]
