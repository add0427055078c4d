"""Metric storage: bytes per point, and the job page's full-range view of long series.

    DATABASE_URL=… REDIS_URL=… python bench/storage.py [--repeats 5] [--fresh]

1. Bytes per point of the raw table: ``pg_total_relation_size`` (heap, TOAST and indexes) of
   ``breakers_metricpoint`` divided by its rows, for a dense per-rank series (8 ranks × 125k
   steps of ``loss``, written with COPY as ingest writes them), after VACUUM. The rollups'
   bytes per raw point they stand for are printed next to it. Then the compacted layout
   (``breakers.storage.compaction``): 1M points of 8 ranks × 12,500 steps × 10 metrics with
   full-precision noisy values (poorly compressible, as real metrics are), compacted into blocks;
   ``pg_total_relation_size`` of ``breakers_metricblock`` (heap, TOAST, indexes) per point.
   And the blocks as ingest writes them before compaction (``store_points``, one block per
   rank and batch): batches of 100 steps × 10 metrics (1M points), and of one step (100k).
   Goal: ≤ 10 B per point.
2. Server time (Django's test client in this process: the view and its queries, no network)
   of the chart's full-range request (``/series?names=loss``, 2,000 points) for
   - a 1M-point series read from raw points (no rollups; the baseline of this run),
   - a 1M-point series read from compacted blocks that also hold three other metrics (no
     rollups: every point unpacked from the blocks), and a zoom on 1 % of it,
   - the same series once rolled up (read from the 1 min rollups),
   - a 100M-point series (8 ranks × 12.5M steps at 10 steps/s, two weeks) whose rollup rows
     are synthesised directly in SQL (its raw points would be past the raw window anyway),
     with the min/max band across ranks, and a zoom on 1 % of it (10 s rollups).
   Goal: each under a second. Medians of ``--repeats``; not a timed assertion.
The jobs are created once in the bench database and reused (``--fresh`` drops them).
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta

# A queue and key prefix of our own, before Django reads its settings (see bench/brake.py).
os.environ["BRAKELINE_CELERY_QUEUE"] = "brakeline-bench-storage"
os.environ["BRAKELINE_CHANNEL_PREFIX"] = "brakeline-bench-storage"

from _stack import median, set_up_django  # noqa: E402

START = datetime(2026, 1, 1, tzinfo=UTC)
TEAM = "bench-storage"

# 100M points as their rollup rows: per rank, one row per 10 s / 60 s bucket of 100 / 600
# steps; the values a slow sine with a spike on rank 5 (never averaged away: min/max rows).
_SYNTH_SQL = """
INSERT INTO breakers_metricrollup (job_id, name, rank, seconds, bucket, first_step, last_step,
  last_value, count, total, squares, min_value, min_step, max_value, max_step,
  nan_count, pos_inf_count, neg_inf_count)
SELECT %(job)s, 'loss', r, w, %(start)s::timestamptz + make_interval(secs => b * w),
  b * w * 10, (b + 1) * w * 10 - 1, 2 + sin(b * w / 5000.0) * 0.1 + r * 0.01,
  w * 10, (2 + r * 0.01) * w * 10, (2 + r * 0.01) ^ 2 * w * 10,
  1.9 + sin(b * w / 5000.0) * 0.1 + r * 0.01, b * w * 10 + 3,
  CASE WHEN r = 5 AND b * w * 10 <= 7654321 AND 7654321 < (b + 1) * w * 10 THEN 50.0
       ELSE 2.1 + sin(b * w / 5000.0) * 0.1 + r * 0.01 END, b * w * 10 + 7,
  0, 0, 0
FROM generate_series(0, %(ranks)s - 1) AS r, (VALUES (10), (60)) AS widths(w),
  LATERAL generate_series(0, %(steps)s / (w * 10) - 1) AS b
"""


def _drop(job) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for table in (
            "breakers_metricpoint",
            "breakers_metricrollup",
            "breakers_rollupcursor",
            "breakers_metricblock",
            "breakers_compactioncursor",
            "breakers_evaluationstate",
        ):
            cursor.execute(f"DELETE FROM {table} WHERE job_id = %s", [job.pk])
    job.delete()


def _job(name: str, fresh: bool):
    from incidents.jobs import create_job
    from incidents.models import Job

    job = Job.objects.filter(team__name=TEAM, name=name).first()
    if job is not None and fresh:
        _drop(job)
        job = None
    return job, job is None and create_job(TEAM, name).job


def _copy(job_id: int, ranks: int, steps: int) -> None:
    from django.db import connection, transaction

    from breakers.agent.store import copy_rows

    with transaction.atomic(), connection.cursor() as cursor:
        rows = (
            (
                job_id,
                "loss",
                s,
                START + timedelta(seconds=s * 0.1),
                2.0 + (s % 97) * 1e-3 + r,
                None,
                r,
            )
            for s in range(steps)
            for r in range(ranks)
        )
        copy_rows(cursor.cursor, rows)


def raw_job(fresh: bool, rolled: bool):
    """1M points of rank 0 (``rolled``: a second job, the same points, rolled up)."""
    from breakers.storage import rollups
    from incidents.models import Job

    existing, created = _job("raw-1m-rolled" if rolled else "raw-1m", fresh)
    if existing is not None:
        return existing
    _copy(created.pk, 1, 1_000_000)
    if rolled:
        while rollups.roll_up_job(created.pk):
            pass
    Job.objects.filter(pk=created.pk).update(current_step=999_999, status="running")
    return Job.objects.get(pk=created.pk)


def _cursors_past(job_id: int) -> int:
    """The evaluator's and the rollups' cursors set past every point of the job (what a real
    stack's worker does as it goes; here without rollup rows, so reads take the raw path)."""
    from breakers.models import EvaluationState, MetricPoint, RollupCursor

    top = MetricPoint.objects.filter(job_id=job_id).order_by("-id").values_list("id", flat=True)
    EvaluationState.objects.update_or_create(job_id=job_id, defaults={"cursor": top[0]})
    RollupCursor.objects.update_or_create(job_id=job_id, defaults={"cursor": top[0]})
    return top[0]


def _copy_metrics(job_id: int, ranks: int, steps: int, names: tuple[str, ...]) -> None:
    import random

    from django.db import connection, transaction

    from breakers.agent.store import copy_rows

    noise = random.Random(22)
    with transaction.atomic(), connection.cursor() as cursor:
        rows = (
            (
                job_id,
                name,
                s,
                START + timedelta(seconds=s * 0.1),
                2.0 + noise.gauss(0, 0.05),
                f"node{r // 4}",
                r,
            )
            for s in range(steps)
            for r in range(ranks)
            for name in names
        )
        copy_rows(cursor.cursor, rows)


def compacted_job(fresh: bool, name: str, ranks: int, steps: int, names: tuple[str, ...]):
    """A job whose points are all compacted into blocks."""
    from breakers.storage import compaction
    from incidents.models import Job

    existing, created = _job(name, fresh)
    if existing is not None:
        return existing
    _copy_metrics(created.pk, ranks, steps, names)
    compaction.compact_job(created.pk, 0, _cursors_past(created.pk))
    Job.objects.filter(pk=created.pk).update(
        current_step=steps - 1, status="running", world_size=ranks
    )
    return Job.objects.get(pk=created.pk)


def compacted_bytes(job, label: str) -> None:
    """Bytes per point of one job's blocks: copied into a table of their own with the same
    columns, storage and indexes (the values are stored again, TOAST and compression as in
    the real table), so no other bench job's blocks are counted."""
    from django.db import connection, transaction

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "CREATE TEMP TABLE measured (LIKE breakers_metricblock INCLUDING ALL) ON COMMIT DROP"
        )
        cursor.execute(
            "INSERT INTO measured SELECT * FROM breakers_metricblock WHERE job_id = %s", [job.pk]
        )
        cursor.execute(
            "SELECT pg_total_relation_size('measured'), pg_relation_size('measured'), "
            "count(*), avg(array_length(names, 1)), "
            "sum((SELECT count(v) FROM unnest(vals) AS v)) FROM measured"
        )
        total, heap, blocks, names, points = cursor.fetchone()
    print(f"{label}: {blocks:,} blocks ({names:.0f} metrics each) holding {points:,} points")
    print(
        f"  bytes per point, heap + TOAST + indexes: {total / points:7.2f} B (heap alone "
        f"{heap / points:.2f} B; goal ≤ 10 B)"
    )


def compaction_cost(repeats: int) -> None:
    """Worker time of compaction per point (200,000 points: 8 ranks × 2,500 steps × 10 metrics)
    against the COPY that wrote them (the ingest floor, measured in the same run)."""
    from breakers.storage import compaction

    copies, compactions = [], []
    for round_ in range(repeats):
        _, created = _job(f"compaction-cost-{round_}", fresh=True)
        started = time.perf_counter()
        _copy_metrics(created.pk, 8, 2_500, tuple(f"m{i}" for i in range(10)))
        copies.append(time.perf_counter() - started)
        bound = _cursors_past(created.pk)
        started = time.perf_counter()
        count = compaction.compact_job(created.pk, 0, bound)
        compactions.append(time.perf_counter() - started)
        _drop(created)
    copy, compact = median(copies) / count * 1e6, median(compactions) / count * 1e6
    print(
        f"Compaction of {count:,} points, median of {repeats}: {compact:.2f} µs per point "
        f"(COPY of the same rows {copy:.2f} µs: ×{compact / copy:.2f})"
    )


def ingested_job(fresh: bool, name: str, ranks: int, steps: int, per_batch: int):
    """A job written through ingest's own store (``store_points``), each rank's batches of
    ``per_batch`` steps × 10 metrics as the SDK sends them: the blocks before compaction."""
    import random

    from breakers.agent.protocol import PointIn
    from breakers.agent.store import store_points
    from incidents.models import Job

    existing, created = _job(name, fresh)
    if existing is not None:
        return existing
    noise = random.Random(23)
    names = tuple(f"m{i}" for i in range(10))
    for first in range(0, steps, per_batch):
        for r in range(ranks):
            store_points(
                created.pk,
                [
                    PointIn(
                        n,
                        s,
                        2.0 + noise.gauss(0, 0.05),
                        START + timedelta(seconds=s * 0.1),
                        f"node{r // 4}",
                        r,
                    )
                    for s in range(first, min(first + per_batch, steps))
                    for n in names
                ],
                job_is_pending=False,
            )
    return Job.objects.get(pk=created.pk)


def synthetic_job(fresh: bool, ranks: int = 8, steps: int = 12_500_000):
    from django.db import connection, transaction

    from breakers.models import RollupCursor
    from incidents.models import Job

    existing, created = _job("rollups-100m", fresh)
    if existing is not None:
        return existing
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _SYNTH_SQL, {"job": created.pk, "start": START, "ranks": ranks, "steps": steps}
        )
    RollupCursor.objects.create(job_id=created.pk, cursor=0)
    Job.objects.filter(pk=created.pk).update(
        current_step=steps - 1, status="running", world_size=ranks
    )
    return Job.objects.get(pk=created.pk)


def bytes_per_point(fresh: bool) -> None:
    """Table and index bytes per raw point (every bench job: the same row shape), and the
    rollups' per point they stand for."""
    from django.db import connection

    from breakers.storage import rollups

    existing, created = _job("bytes-8x125k", fresh)
    job = existing or created
    if existing is None:
        _copy(job.pk, 8, 125_000)
        while rollups.roll_up_job(job.pk):
            pass
    with connection.cursor() as cursor:
        # FULL: compacting the other bench jobs left the table's pages half empty.
        cursor.execute("VACUUM FULL ANALYZE breakers_metricpoint")
        cursor.execute("VACUUM ANALYZE breakers_metricrollup")
        cursor.execute("SELECT count(*) FROM breakers_metricpoint")
        points = cursor.fetchone()[0]
        sizes = {}
        for table in ("breakers_metricpoint", "breakers_metricrollup"):
            cursor.execute(
                "SELECT pg_total_relation_size(%s), pg_relation_size(%s)", [table, table]
            )
            sizes[table] = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM breakers_metricrollup")
        rollup_rows = cursor.fetchone()[0]
        cursor.execute(
            "SELECT coalesce(sum(count + nan_count + pos_inf_count + neg_inf_count), 0)"
            " FROM breakers_metricrollup WHERE seconds = 60"
        )
        rolled_points = cursor.fetchone()[0]
    total, heap = sizes["breakers_metricpoint"]
    print(f"Raw points: {points:,} rows in the bench database (every bench job)")
    print(
        f"  bytes per point, table + indexes: {total / points:7.1f} B (heap alone "
        f"{heap / points:.1f} B)"
    )
    rtotal, _ = sizes["breakers_metricrollup"]
    print(
        f"Rollups: {rollup_rows:,} rows standing for {rolled_points:,} points "
        f"(10 s + 1 min): {rtotal / max(rolled_points, 1):.2f} B per point they stand for"
    )


def series_times(jobs: list[tuple[str, object, str]], repeats: int) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from incidents.models import Membership, Role

    user, _ = get_user_model().objects.get_or_create(username="bench-storage")
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    print(f"Server time of the chart's request, median of {repeats}:")
    baseline = None
    for label, job, query in jobs:
        Membership.objects.get_or_create(user=user, team=job.team, defaults={"role": Role.VIEWER})
        url = f"/api/v1/jobs/{job.pk}/series?names=loss{query}"
        timings, source = [], ""
        for _ in range(repeats):
            started = time.perf_counter()
            response = client.get(url)
            timings.append(time.perf_counter() - started)
            assert response.status_code == 200, (url, response.status_code)
            source = response.json()["series"]["loss"]["source"]
        took = median(timings)
        baseline = baseline or took
        print(f"  {label:<44} {took * 1000:8.1f} ms  ×{took / baseline:5.2f}  ({source})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fresh", action="store_true", help="rebuild the bench jobs")
    args = parser.parse_args()
    set_up_django()
    started = time.perf_counter()
    raw = raw_job(args.fresh, rolled=False)
    rolled = raw_job(args.fresh, rolled=True)
    synthetic = synthetic_job(args.fresh)
    blocks = compacted_job(
        args.fresh, "blocks-1m-4", 1, 1_000_000, ("loss", "grad_norm", "lr", "throughput")
    )
    dense = compacted_job(
        args.fresh, "blocks-8x12.5k-10", 8, 12_500, tuple(f"m{i}" for i in range(10))
    )
    bytes_per_point(args.fresh)
    big = ingested_job(args.fresh, "ingest-8x12.5k-10-b100", 8, 12_500, 100)
    small = ingested_job(args.fresh, "ingest-8x1.25k-10-b1", 8, 1_250, 1)
    compacted_bytes(big, "As ingest writes them, batches of 100 steps × 10 metrics a rank")
    compacted_bytes(small, "As ingest writes them, batches of one step × 10 metrics a rank")
    compacted_bytes(dense, "Compacted, 8 ranks × 12,500 steps × 10 metrics")
    compacted_bytes(blocks, "Compacted, 1 rank × 1M steps × 4 metrics")
    compaction_cost(3)
    print(f"(bench data ready in {time.perf_counter() - started:.0f} s)")
    series_times(
        [
            ("1M points, raw (baseline)", raw, ""),
            ("1M points, rolled up", rolled, ""),
            ("1M points, compacted blocks (4 metrics each)", blocks, ""),
            (
                "1M points compacted, zoom on 1 % (10k steps)",
                blocks,
                "&from_step=500000&to_step=509999",
            ),
            ("100M points (8 ranks), rollups + band", synthetic, ""),
            ("100M points, rank 5 only", synthetic, "&rank=5&spread=0"),
            (
                "100M points, zoom on 1 % (125k steps)",
                synthetic,
                "&from_step=7600000&to_step=7724999",
            ),
        ],
        args.repeats,
    )


if __name__ == "__main__":
    main()
