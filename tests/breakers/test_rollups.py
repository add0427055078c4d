"""Rollups per rank (10 s / 1 min; min/max/mean/last/count, NaN and ±Inf counted) merged
exactly once, on real PostgreSQL; the named task through the real Celery worker."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.models import MetricRollup, RollupCursor
from breakers.storage import rollups
from breakers.storage.points import stored_points
from tests.support.waiting import wait_for
from tests.support.worker import worker_idle

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NAN, INF = float("nan"), float("inf")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reference(points: list[PointIn], seconds: int) -> dict:
    """What each bucket should hold, computed in Python from the points themselves."""
    grouped: dict = {}
    for order, p in enumerate(points):
        assert p.time is not None
        key = (p.name, p.rank, int(p.time.timestamp()) // seconds * seconds)
        grouped.setdefault(key, []).append((order, p))
    expected = {}
    for key, rows in grouped.items():
        finite = [(p.value, p.step) for _, p in rows if math.isfinite(p.value)]
        last = max(rows, key=lambda r: (r[1].step, r[0]))[1]
        kinds = {
            label: [p.step for _, p in rows if test(p.value)]
            for label, test in (
                ("nan", math.isnan),
                ("pos_inf", lambda v: v == INF),
                ("neg_inf", lambda v: v == -INF),
            )
        }
        expected[key] = {
            "first_step": min(p.step for _, p in rows),
            "last": (last.step, last.value if math.isfinite(last.value) else repr(last.value)),
            "count": len(finite),
            "mean": pytest.approx(sum(v for v, _ in finite) / len(finite)) if finite else None,
            "min": min(finite) if finite else None,
            "max": max(finite, key=lambda f: (f[0], -f[1])) if finite else None,
            **{f"{k}_count": len(v) for k, v in kinds.items()},
            **{f"{k}_step": min(v, default=None) for k, v in kinds.items()},
        }
    return expected


def stored(job_id: int, seconds: int) -> dict:
    got = {}
    for r in MetricRollup.objects.filter(job_id=job_id, seconds=seconds):
        last = r.last_value if math.isfinite(r.last_value) else repr(r.last_value)
        got[(r.name, r.rank, int(r.bucket.timestamp()))] = {
            "first_step": r.first_step,
            "last": (r.last_step, last),
            "count": r.count,
            "mean": r.total / r.count if r.count else None,
            "min": (r.min_value, r.min_step) if r.min_value is not None else None,
            "max": (r.max_value, r.max_step) if r.max_value is not None else None,
            **{
                f"{k}_{f}": getattr(r, f"{k}_{f}")
                for k in ("nan", "pos_inf", "neg_inf")
                for f in ("count", "step")
            },
        }
    return got


def mixed_points(start_step: int, count: int, offset: float, ranks: int = 3) -> list[PointIn]:
    """Three ranks of loss with NaN, ±Inf and spikes at different steps, plus a grad_norm."""
    specials = {3: NAN, 7: INF, 11: -INF, 13: 50.0, 17: -50.0, 19: NAN}
    points = []
    for i in range(count):
        step = start_step + i
        for rank in range(ranks):
            value = specials.get((i + 5 * rank) % 23, math.sin(step / 5.0) + rank)
            points.append(PointIn("loss", step, value, at(offset + i * 0.7), None, rank))
        points.append(PointIn("grad_norm", step, float(step % 9), at(offset + i * 0.7), None))
    return points


def test_rollups_per_rank_hold_min_max_mean_last_and_non_finite_merged_exactly_once(make_agent):
    job = make_agent()
    first = mixed_points(0, 120, 0.0)
    store_points(job.job_id, first)
    assert rollups.roll_up_all() == {job.job_id: len(first)}
    assert rollups.roll_up_all() == {}  # caught up: the cursor says so, nothing counted twice
    assert rollups.roll_up_job(job.job_id) == 0
    # Later points land partly in buckets that already exist (same times): merged, not replaced.
    second = mixed_points(120, 80, 40.0)
    store_points(job.job_id, second)
    assert rollups.roll_up_all() == {job.job_id: len(second)}
    for seconds in rollups.WIDTHS:
        assert stored(job.job_id, seconds) == reference(first + second, seconds)
    assert {r for r in MetricRollup.objects.values_list("rank", flat=True)} == {0, 1, 2}
    nan_total = sum(r.nan_count for r in MetricRollup.objects.filter(seconds=60))
    assert nan_total == sum(1 for p in first + second if math.isnan(p.value))
    assert RollupCursor.objects.get(job_id=job.job_id).cursor == max(
        p.id for p in stored_points(job.job_id)
    )


def test_small_batches_give_the_same_rollups_as_one(make_agent):
    job = make_agent()
    points = mixed_points(0, 150, 0.0)
    store_points(job.job_id, points)
    while rollups.roll_up_batch(job.job_id, limit=37):
        pass
    assert stored(job.job_id, 10) == reference(points, 10)


def test_the_beat_runs_both_tasks_by_their_names_behind_the_evaluations(settings):
    # Not app.loader.import_default_modules(): before the session's in-thread worker starts it
    # would build Celery's Django worker fixup with the production CELERY_DB_REUSE_MAX, and the
    # worker would then keep its connections across tests (the hang tests/conftest.py guards).
    from breakers.storage import tasks
    from config.celery import app
    from config.schedule import PERIODIC

    names = {"storage.roll_up", "storage.prune", "storage.compact"}
    assert names <= {entry.task for entry in PERIODIC}
    assert {tasks.roll_up.name, tasks.prune.name, tasks.compact.name} == names
    assert names <= set(app.tasks)
    assert {settings.CELERY_TASK_ROUTES[n]["queue"] for n in names} == {settings.TICK_QUEUE}


@pytest.mark.django_db(transaction=True)
def test_the_real_worker_rolls_up_through_the_named_task(make_agent, worker):
    from breakers.storage import tasks

    job = make_agent()
    points = mixed_points(0, 60, 0.0)
    store_points(job.job_id, points)
    tasks.roll_up.delay()
    tasks.roll_up.delay()  # twice on purpose: a beat that fires again must not double count
    wait_for(
        lambda: RollupCursor.objects.filter(job_id=job.job_id, cursor__gt=0).exists(),
        "the worker to roll up the job",
    )
    wait_for(worker_idle, "the worker to finish")
    assert stored(job.job_id, 60) == reference(points, 60)
