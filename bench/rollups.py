"""Charts of a long run from raw points vs from rollups, and what each costs on disk.

    DATABASE_URL=… REDIS_URL=… python bench/rollups.py [--repeats 7]

A 1,000,000-point loss series (one step a second: 11.6 days; 16,667 one-minute and 100,000
ten-second buckets) is written with COPY into two jobs of the bench database (once, reused):
one keeps its raw points, the other is rolled up (``breakers.history.rollups``) and its raw
points pruned (``breakers.history.retention`` with the clock a month on), as a run older than
the raw window would be. Printed: the server time (Django's test client in this process: view
and queries, no network) of the job page's full-range read of each, medians and their ratio;
the time to merge the million points; and bytes per point of the raw table and of the rollups
(pg_total_relation_size: heap, indexes, TOAST). Printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta

os.environ["BRAKELINE_CELERY_QUEUE"] = "brakeline-bench-rollups"
os.environ["BRAKELINE_CHANNEL_PREFIX"] = "brakeline-bench-rollups"

from _stack import median, set_up_django  # noqa: E402

POINTS = 1_000_000
START = datetime(2026, 1, 1, tzinfo=UTC)


def make_job(name: str):
    """A job with the 1M-point loss series (a spike and a NaN in it), created once."""
    from django.db import connection, transaction

    from breakers.agent.store import copy_rows
    from incidents.jobs import create_job
    from incidents.models import Job

    job = Job.objects.filter(team__name="bench", name=name).first()
    if job is not None:
        return job, False
    job = create_job("bench", name).job

    def value(step: int) -> float:
        if step == 777_777:
            return 50.0
        return float("nan") if step == 451_200 else 2.0 + (step % 97) * 1e-3

    with transaction.atomic(), connection.cursor() as cursor:
        rows = (
            (job.pk, "loss", s, START + timedelta(seconds=s), value(s), None) for s in range(POINTS)
        )
        copy_rows(cursor.cursor, rows)
    Job.objects.filter(pk=job.pk).update(current_step=POINTS - 1, status="running")
    return Job.objects.get(pk=job.pk), True


def roll_up_and_prune(job) -> None:
    from breakers.history import retention, rollups

    started = time.perf_counter()
    merged = 0
    while done := rollups.roll_up_job(job.pk):
        merged += done
    elapsed = time.perf_counter() - started
    print(f"Rolling up {merged:,} points: {elapsed:.1f} s ({merged / elapsed:,.0f} points/s)")
    retention.prune(now=START + timedelta(seconds=POINTS) + timedelta(days=10))


def server_time(client, job, repeats: int) -> tuple[float, dict]:
    url = f"/api/v1/jobs/{job.pk}/series?names=loss"
    timings, body = [], {}
    for _ in range(repeats):
        started = time.perf_counter()
        response = client.get(url)
        timings.append(time.perf_counter() - started)
        assert response.status_code == 200, response.status_code
        body = response.json()["series"]["loss"]
    return median(timings), body


def sizes() -> None:
    from django.db import connection

    from breakers.models import MetricPoint, MetricRollup

    with connection.cursor() as cursor:
        for label, model in (("raw points", MetricPoint), ("rollups", MetricRollup)):
            table = model._meta.db_table
            cursor.execute(f"SELECT pg_total_relation_size('{table}'), count(*) FROM {table}")
            size, rows = cursor.fetchone()
            per_row = size / max(rows, 1)
            print(f"  {label:<11} {rows:>10,} rows {size / 2**20:8.1f} MiB {per_row:6.0f} B/row")
        table = MetricRollup._meta.db_table
        cursor.execute(
            "SELECT coalesce(sum(count + nan_count + pos_inf_count + neg_inf_count), 0), "
            f"pg_total_relation_size('{table}') FROM {table} WHERE seconds = 60"
        )
        points, size = cursor.fetchone()
        if points:
            print(f"  rollups (both widths) per raw point they stand for: {size / points:.1f} B")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    set_up_django()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from incidents.models import Membership, Role

    raw_job, _ = make_job("rollups-raw-1m")
    rolled_job, created = make_job("rollups-rolled-1m")
    if created:
        roll_up_and_prune(rolled_job)
    with connection.cursor() as cursor:
        # The pruned job's deleted rows would otherwise count in the raw table's size
        # (a plain VACUUM frees their space for reuse but keeps the file as large).
        cursor.execute("VACUUM FULL ANALYZE breakers_metricpoint")
        cursor.execute("VACUUM ANALYZE breakers_metricrollup")
    user, _ = get_user_model().objects.get_or_create(username="bench-rollups")
    Membership.objects.get_or_create(user=user, team=raw_job.team, defaults={"role": Role.ONCALL})
    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user)
    raw_s, raw_body = server_time(client, raw_job, args.repeats)
    rolled_s, rolled_body = server_time(client, rolled_job, args.repeats)
    print(f"Full-range series read of {POINTS:,} points (→ 2000), median of {args.repeats}:")
    print(f"  from raw points {raw_s * 1000:8.1f} ms ({len(raw_body['steps'])} points drawn)")
    print(f"  from rollups    {rolled_s * 1000:8.1f} ms ({len(rolled_body['steps'])} points drawn)")
    print(f"  raw / rollups   {raw_s / rolled_s:8.1f}×")
    for label, body in (("raw", raw_body), ("rollups", rolled_body)):
        by_step = dict(zip(body["steps"], body["values"], strict=True))
        print(f"  {label}: spike at 777,777 drawn: {by_step.get(777_777) == 50.0}, "
              f"NaN at 451,200 drawn: {by_step.get(451_200) == 'NaN'}")  # fmt: skip
    print("On disk (whole bench database):")
    sizes()


if __name__ == "__main__":
    main()
