"""Evaluation delay: metric point committed → alert committed, at 5,000 points/s of ingest.

    make bench-style env (DATABASE_URL, REDIS_URL), then:  python bench/evaluation.py

A real Celery worker (``celery -A config worker --pool solo``, a subprocess on a queue of its
own) evaluates one job while this process ingests through ``breakers.agent.service.ingest_metrics``
(parse, COPY, schedule after commit: the agent endpoint minus HTTP) at a steady rate in batches.
Every ``--nan-every`` seconds a batch ends with a NaN loss; the default pack's L3 rule raises
an alert for it. Two delays per injected NaN, from the moment that batch committed:
* raised — the alert's ``raised_at``, set inside the evaluation transaction;
* visible — when a separate connection first sees the alert row, i.e. its commit (polled
  every 2 ms, so up to 2 ms late).
Median and p95 of each are printed. Then the evaluator's own cost: ``evaluate_job`` run in
this process over a backlog of ``--backlog`` points (loss and grad_norm, one and two ranks;
stored directly, nothing scheduled), in µs of wall time per point, median of 3 runs.
Runs in the scratch database ``<name>_bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time

# Before Django reads its settings: a queue and key prefix of our own, so neither a
# development worker nor the test suite (same Redis database) takes our tasks or flags.
os.environ["BRAKELINE_CELERY_QUEUE"] = "brakeline-bench"
os.environ["BRAKELINE_CHANNEL_PREFIX"] = "brakeline-bench"

from _stack import median, percentile, set_up_django, start_worker  # noqa: E402

NAN_RULE = "non-finite-loss-or-gradients"


def batch_body(first_step: int, size: int, nan: bool) -> bytes:
    """``size`` points: loss and grad_norm per step; with ``nan`` the last loss is NaN."""
    points = []
    for i in range(size // 2):
        step = first_step + i
        points.append({"name": "loss", "step": step, "value": 2.0 + 0.01 * (step % 7)})
        points.append({"name": "grad_norm", "step": step, "value": 1.0 + 0.01 * (step % 5)})
    if nan:
        points[-2]["value"] = "NaN"
    return json.dumps({"points": points}).encode()


def last_point_id(job_id: int) -> int:
    """The job's greatest point id: raw rows' and blocks' (one id sequence)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT greatest((SELECT max(id) FROM breakers_metricpoint WHERE job_id = %s), "
            "(SELECT max(last_id) FROM breakers_metricblock WHERE job_id = %s))",
            [job_id, job_id],
        )
        return cursor.fetchone()[0] or 0


def point_count(job_id: int) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM brakeline_points_after(%s, 0, 9223372036854775807)", [job_id]
        )
        return int(cursor.fetchone()[0])


def forget_points(job_id: int) -> None:
    from breakers.models import MetricBlock, MetricPoint

    MetricPoint.objects.filter(job_id=job_id).delete()
    MetricBlock.objects.filter(job_id=job_id).delete()


def wait_until_evaluated(job_id: int, timeout: float) -> float:
    """Seconds until the evaluator's cursor reached the job's last point."""
    from breakers.models import EvaluationState

    started = time.monotonic()
    target = last_point_id(job_id)
    while time.monotonic() - started < timeout:
        state = EvaluationState.objects.filter(job_id=job_id).first()
        if state is not None and state.cursor >= target:
            return time.monotonic() - started
        time.sleep(0.01)
    raise SystemExit(f"the worker did not catch up within {timeout:.0f} s (is it running?)")


class AlertWatcher(threading.Thread):
    """Polls for new NaN alerts of the job on its own connection; notes when each appears."""

    def __init__(self, job_id: int) -> None:
        super().__init__(daemon=True)
        self.job_id, self.seen, self.stop = job_id, {}, threading.Event()

    def run(self) -> None:
        import psycopg
        from django.conf import settings

        db = settings.DATABASES["default"]
        dsn = f"host={db['HOST']} port={db['PORT'] or 5432} user={db['USER']} dbname={db['NAME']}"
        sql = (
            "SELECT id, first_step, raised_at FROM incidents_alert "
            "WHERE job_id = %s AND rule_key = %s AND id > %s ORDER BY id"
        )
        last_id = 0
        with psycopg.connect(dsn, autocommit=True) as connection:
            while not self.stop.is_set():
                for alert_id, first_step, raised_at in connection.execute(
                    sql, [self.job_id, NAN_RULE, last_id]
                ).fetchall():
                    self.seen[first_step] = (time.time(), raised_at.timestamp())
                    last_id = alert_id
                time.sleep(0.002)


def ingest(job, args) -> dict[int, float]:
    """Ingest at the target rate; returns {NaN step: commit time of its batch}."""
    from django.db import transaction

    from breakers.agent.service import ingest_metrics

    interval = args.batch / args.rate
    batches = int(args.seconds / interval)
    nan_every = max(1, round(args.nan_every / interval))
    committed: dict[int, float] = {}
    step, next_at = 10_000, time.monotonic()
    for index in range(batches):
        nan = index % nan_every == nan_every - 1
        body = batch_body(step, args.batch, nan)
        nan_step = step + args.batch // 2 - 1
        with transaction.atomic():
            # Registered first, so it runs right at commit, before ingest's own scheduling.
            if nan:
                transaction.on_commit(lambda s=nan_step: committed.__setitem__(s, time.time()))
            ingest_metrics(job, body)
        step += args.batch // 2
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    return committed


def report(label: str, delays: list[float]) -> None:
    print(
        f"  {label:<8} median {median(delays) * 1e3:7.1f} ms   p95 "
        f"{percentile(delays, 0.95) * 1e3:7.1f} ms   max {max(delays) * 1e3:7.1f} ms"
    )


def backlog_cost(ranks: int, points: int, repeat: int = 3) -> float:
    """µs per point of ``evaluate_job`` (read, engine, state save) over a stored backlog."""
    from datetime import UTC, datetime, timedelta

    from breakers.agent.protocol import PointIn
    from breakers.agent.store import store_points
    from breakers.detection.evaluation import evaluate_job
    from breakers.models import EvaluationState
    from incidents.jobs import create_job

    job_id = create_job("bench", f"backlog-{ranks}-{time.time_ns()}").job.pk
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    steps = points // (2 * ranks)
    for first in range(0, steps, 1000):
        for rank in range(ranks):
            batch = [
                PointIn(
                    name,
                    step,
                    base + 0.5 * rank + 0.01 * (step % 7),
                    t0 + timedelta(seconds=step),
                    None,
                    rank,
                )
                for step in range(first, min(first + 1000, steps))
                for name, base in (("loss", 2.0), ("grad_norm", 1.0))
            ]
            store_points(job_id, batch)
    costs = []
    for _ in range(repeat):
        EvaluationState.objects.filter(job_id=job_id).delete()
        started = time.perf_counter()
        evaluated = evaluate_job(job_id).points
        costs.append((time.perf_counter() - started) / evaluated * 1e6)
    forget_points(job_id)
    return median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=5_000, help="points per second")
    parser.add_argument("--batch", type=int, default=500, help="points per batch")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--nan-every", type=float, default=0.5, help="seconds between NaNs")
    parser.add_argument("--backlog", type=int, default=100_000, help="points of the backlog")
    args = parser.parse_args()
    set_up_django()
    from incidents.jobs import create_job
    from incidents.models import Job

    job = Job.objects.get(pk=create_job("bench", f"evaluation-{int(time.time())}").job.pk)
    worker = start_worker()
    watcher = AlertWatcher(job.pk)
    try:
        from breakers.agent.service import ingest_metrics

        ingest_metrics(job, batch_body(0, 1000, nan=False))  # warm-up: the worker is up
        wait_until_evaluated(job.pk, timeout=60)
        watcher.start()
        started = time.monotonic()
        committed = ingest(job, args)
        elapsed = time.monotonic() - started
        catch_up = wait_until_evaluated(job.pk, timeout=60)
        time.sleep(0.05)
    finally:
        watcher.stop.set()
        worker.terminate()
        worker.wait(timeout=30)
    missing = sorted(set(committed) - set(watcher.seen))
    raised = [watcher.seen[s][1] - t for s, t in committed.items() if s in watcher.seen]
    visible = [watcher.seen[s][0] - t for s, t in committed.items() if s in watcher.seen]
    points = point_count(job.pk)
    print(
        f"ingest: {points - 1000:,} points in {elapsed:.1f} s = {(points - 1000) / elapsed:,.0f} "
        f"points/s (target {args.rate:,.0f}), batches of {args.batch}; one solo worker"
    )
    print(f"NaN injected: {len(committed)}; alerts seen: {len(raised)}; missing: {missing or 0}")
    print("delay from the NaN batch's commit to the L3 alert:")
    report("raised", raised)
    report("visible", visible)
    print(f"after the last batch the evaluator caught up in {catch_up * 1e3:.0f} ms")
    forget_points(job.pk)
    for ranks in (1, 2):
        cost = backlog_cost(ranks, args.backlog)
        print(
            f"evaluate_job over a {args.backlog:,}-point backlog, {ranks} rank(s): "
            f"{cost:.1f} µs/point (median of 3)"
        )


if __name__ == "__main__":
    main()
