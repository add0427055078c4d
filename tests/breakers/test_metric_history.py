"""Rollups (10 s / 1 min, merged exactly once) and retention (raw window, never around an
incident), on real PostgreSQL with the clock moved."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.history import retention, rollups
from breakers.models import MetricPoint, MetricRollup, RollupCursor
from incidents.models import Incident, IncidentStatus
from tests.support.waiting import wait_for
from tests.support.worker import worker_idle

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NAN, INF = float("nan"), float("inf")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def reference(points: list[PointIn], seconds: int) -> dict:
    """What a bucket should hold, computed in Python from the points themselves."""
    out: dict = {}
    for order, p in enumerate(points):
        key = (p.name, p.node or "", int(p.time.timestamp()) // seconds * seconds)
        out.setdefault(key, []).append((order, p))
    expected = {}
    for key, rows in out.items():
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
            "last_step": last.step,
            "count": len(finite),
            "total": pytest.approx(sum(v for v, _ in finite)),
            "min": min(finite) if finite else None,
            "max": max(finite, key=lambda f: (f[0], -f[1])) if finite else None,
            **{f"{k}_count": len(v) for k, v in kinds.items()},
            **{f"{k}_step": min(v, default=None) for k, v in kinds.items()},
        }
    return expected


def stored(job_id: int, seconds: int) -> dict:
    got = {}
    for r in MetricRollup.objects.filter(job_id=job_id, seconds=seconds):
        got[(r.name, r.node, int(r.bucket.timestamp()))] = {
            "first_step": r.first_step,
            "last_step": r.last_step,
            "count": r.count,
            "total": r.total,
            "min": (r.min_value, r.min_step) if r.min_value is not None else None,
            "max": (r.max_value, r.max_step) if r.max_value is not None else None,
            **{
                f"{k}_{f}": getattr(r, f"{k}_{f}")
                for k in ("nan", "pos_inf", "neg_inf")
                for f in ("count", "step")
            },
        }
    return got


def mixed_points(start_step: int, count: int, offset: float) -> list[PointIn]:
    specials = {3: NAN, 7: INF, 11: -INF, 13: 50.0, 17: -50.0, 19: NAN}
    points = []
    for i in range(count):
        step = start_step + i
        value = specials.get(i % 23, math.sin(step / 5.0))
        node = "node-a" if i % 2 else None
        points.append(PointIn("loss", step, value, at(offset + i * 0.7), node))
        points.append(PointIn("grad_norm", step, float(step % 9), at(offset + i * 0.7), None))
    return points


def test_rollups_hold_min_max_mean_last_and_non_finite_counts_merged_exactly_once(make_agent):
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
    nan_total = sum(r.nan_count for r in MetricRollup.objects.filter(seconds=60))
    assert nan_total == sum(1 for p in first + second if math.isnan(p.value))
    assert RollupCursor.objects.get(job_id=job.job_id).cursor == MetricPoint.objects.latest("id").id


def test_small_batches_give_the_same_rollups_as_one(make_agent):
    job = make_agent()
    points = mixed_points(0, 150, 0.0)
    store_points(job.job_id, points)
    while rollups.roll_up_batch(job.job_id, limit=37):
        pass
    assert stored(job.job_id, 10) == reference(points, 10)


def test_the_beat_runs_both_tasks_by_their_names():
    from config.celery import app
    from config.schedule import PERIODIC

    tasks = {entry.task for entry in PERIODIC}
    assert {"history.roll_up", "history.prune"} <= tasks
    app.loader.import_default_modules()
    assert {"history.roll_up", "history.prune"} <= set(app.tasks)


def series_points(job_id: int, steps: range, start: float, every: float) -> None:
    store_points(
        job_id, [PointIn("loss", s, 1.0 + s % 5, at(start + i * every), None) for i, s in
                 enumerate(steps)]
    )  # fmt: skip


def remaining_steps(job_id: int) -> set[int]:
    return set(MetricPoint.objects.filter(job_id=job_id).values_list("step", flat=True))


def test_retention_deletes_old_raw_points_but_never_around_incidents(make_agent, settings):
    settings.METRIC_RAW_RETENTION_SECONDS = 72 * 3600
    settings.METRIC_INCIDENT_MARGIN_STEPS = 10
    settings.METRIC_ROLLUP_RETENTION_DAYS = 30
    closed, open_, quiet, unrolled = (make_agent() for _ in range(4))
    for job in (closed, open_, quiet, unrolled):
        series_points(job.job_id, range(0, 1000), 0.0, 60.0)  # steps 0..999, one a minute
    for job in (closed, open_, quiet):
        rollups.roll_up_job(job.job_id)
    # closed: an episode from step 300 resolved at step 400's time; open_: active from 500.
    Incident.objects.create(
        job_id=closed.job_id, title="spike", level="L2", opened_at=at(300 * 60),
        first_step=300, first_time=at(300 * 60), resolved_at=at(400 * 60),
        status=IncidentStatus.RESOLVED,
    )  # fmt: skip
    Incident.objects.create(
        job_id=open_.job_id, title="nan", level="L3", opened_at=at(500 * 60),
        first_step=500, first_time=at(500 * 60),
    )  # fmt: skip
    all_steps = set(range(1000))
    with time_machine.travel(at(71 * 3600), tick=False):
        assert retention.prune() == retention.Pruned(0, 0)  # nothing is 72 h old yet
    with time_machine.travel(at(100 * 60 + 72 * 3600), tick=False):
        retention.prune()  # steps 0..99 are past the window now, 100 is not
    assert min(remaining_steps(quiet.job_id)) == 100
    # 72 h after step 999's time plus 100 minutes: steps 0..~1099 are past the window → all.
    with time_machine.travel(at(1100 * 60 + 72 * 3600), tick=False):
        pruned = retention.prune()
        assert retention.prune() == retention.Pruned(0, 0)  # idempotent
    assert remaining_steps(quiet.job_id) == set()
    assert remaining_steps(closed.job_id) == set(range(290, 401))  # margin, then to the close
    assert remaining_steps(open_.job_id) == set(range(490, 1000))  # active: for ever
    assert remaining_steps(unrolled.job_id) == all_steps  # not in the rollups yet: kept
    assert pruned.raw_points == 900 + (1000 - 111 - 100) + (490 - 100) and pruned.rollups == 0
    # The rollups still hold every point of the deleted ones.
    assert sum(MetricRollup.objects.filter(job_id=quiet.job_id, seconds=60).values_list(
        "count", flat=True)) == 1000  # fmt: skip
    with time_machine.travel(at(500 * 60) + timedelta(days=30), tick=False):
        retention.prune()  # months later, the older half of the rollups go
    kept = MetricRollup.objects.filter(job_id=quiet.job_id, seconds=60)
    assert min(kept.values_list("first_step", flat=True)) == 500
    with time_machine.travel(at(1000 * 60) + timedelta(days=30), tick=False):
        pruned = retention.prune()
    assert pruned.rollups > 0 and not MetricRollup.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_real_worker_rolls_up_through_the_named_task(make_agent, worker):
    from breakers.history import tasks

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
