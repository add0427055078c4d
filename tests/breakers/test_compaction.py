"""Compaction: ingest's narrow blocks (and raw rows of a console upgraded from row storage) merge
into wide blocks; every reader answers the same before and after, the compaction cursor never
passes the evaluator's or the rollups', two rounds never fold a point twice, retention keeps the
freeze around an incident in blocks too. Real PostgreSQL; the clock
is fixed to dates of 2026's spring, never today's."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from breakers import metrics
from breakers.agent.protocol import PointIn
from breakers.agent.store import copy_rows, store_points
from breakers.models import CompactionCursor, EvaluationState, MetricBlock, MetricPoint
from breakers.storage import compaction, retention, rollups
from breakers.storage.blocks import (
    BLOCK_CELLS,
    BLOCK_COLUMNS,
    BLOCK_STEP_SPAN,
    EPOCH,
    batch_rows,
    blocks_of,
)
from breakers.storage.buckets import fetch_buckets
from breakers.storage.points import stored_points
from breakers.storage.reading import raw_range
from console.api.jobs import visible_jobs
from incidents.models import Incident, IncidentStatus

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
NAN, INF = float("nan"), float("inf")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def point(i: int, name: str, step: int, value: float = 1.0, *, rank=0, node=None, t=None):
    """A point as compaction reads it: its time in microseconds since the epoch."""
    microseconds = (at(step if t is None else t) - EPOCH) // timedelta(microseconds=1)
    return (i, name, step, microseconds, value, node, rank)


# --- The pure layout: points → blocks ---------------------------------------------------------


def shape(points) -> list[tuple]:
    return [
        (
            b.rank,
            b.node,
            [c.step for c in b.columns],
            sorted({n for c in b.columns for n in c.values}),
        )
        for b in blocks_of(points)
    ]


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        pytest.param(  # two metrics on every step: one block, one column per step
            [point(1, "loss", 0), point(2, "lr", 0), point(3, "loss", 1), point(4, "lr", 1)],
            [(0, None, [0, 1], ["loss", "lr"])],
            id="dense",
        ),
        pytest.param(  # a metric logged on some steps only: absent (NULL), not a new block
            [point(1, "loss", 0), point(2, "loss", 1), point(3, "eval", 1), point(4, "loss", 2)],
            [(0, None, [0, 1, 2], ["eval", "loss"])],
            id="sparse",
        ),
        pytest.param(  # a restart re-logs steps 1 and 2: their second logging is a column too
            [point(1, "loss", 1), point(2, "loss", 2), point(3, "loss", 1), point(4, "loss", 2)],
            [(0, None, [1, 1, 2, 2], ["loss"])],
            id="restart-relogs",
        ),
        pytest.param(  # ranks and nodes never share a block
            [
                point(1, "loss", 0),
                point(2, "loss", 0, rank=1, node="n1"),
                point(3, "loss", 0, rank=1),
            ],
            [(0, None, [0], ["loss"]), (1, "n1", [0], ["loss"]), (1, None, [0], ["loss"])],
            id="ranks-and-nodes",
        ),
        pytest.param(  # steps far apart: the span cap starts a new block
            [
                point(1, "loss", 0),
                point(2, "loss", BLOCK_STEP_SPAN - 1),
                point(3, "loss", BLOCK_STEP_SPAN),
            ],
            [(0, None, [0, BLOCK_STEP_SPAN - 1], ["loss"]), (0, None, [BLOCK_STEP_SPAN], ["loss"])],
            id="step-span",
        ),
    ],
)
def test_points_fold_into_blocks(points, expected):
    assert shape(points) == expected


def test_a_block_holds_at_most_its_columns_and_keeps_each_points_time():
    points = [point(i, "loss", i, t=i * 2.0) for i in range(BLOCK_COLUMNS + 3)]
    points.append(point(9999, "lr", 5, t=10.5))  # step 5's column is at 10 s: +0.5 s
    blocks = blocks_of(points)
    assert [len(b.columns) for b in blocks] == [BLOCK_COLUMNS, 3]
    row = blocks[0].row(job_id=1)
    names, vals, tdelta = row[8], row[11], row[12]
    assert names == ["loss", "lr"]
    assert vals[1][5] == 1.0 and vals[1][4] is None
    assert tdelta[1][5] == 500_000 and tdelta[0][5] == 0
    assert blocks[1].row(job_id=1)[12] is None  # every point at its column's time: no deltas


def test_one_metric_logged_at_one_step_many_times_folds_in_linear_time():
    points = [point(i, "loss", 7, float(i)) for i in range(50_000)]  # quadratic: ~10⁹ probes
    blocks = blocks_of(points)
    assert sum(len(b.columns) for b in blocks) == 50_000
    values = [c.values["loss"][0] for b in blocks for c in b.columns]
    assert values == [float(i) for i in range(50_000)]  # every logging kept, in order


def test_hundreds_of_metrics_a_step_make_narrower_blocks_never_a_huge_grid():
    names = [f"layer{i}.grad_norm" for i in range(1000)]
    points = [point(s * 1000 + i, name, s) for s in range(300) for i, name in enumerate(names)]
    blocks = blocks_of(points)
    assert {len(b.columns) for b in blocks[:-1]} == {BLOCK_CELLS // 1000}
    assert sum(len(b.columns) for b in blocks) == 300
    one_column = blocks_of([point(i, f"m{i}", 0) for i in range(BLOCK_CELLS + 1)])
    assert [len(b.columns) for b in one_column] == [1]  # a step's metrics stay together


def _general(points: list[PointIn], received: datetime) -> list[tuple]:
    """What the general shaping makes of a batch, as ingest's rows (without last_id)."""
    shaped = [
        (i, p.name, p.step, (p.time or received) - EPOCH, p.value, p.node, p.rank)
        for i, p in enumerate(points)
    ]
    shaped = [(*t[:3], t[3] // timedelta(microseconds=1), *t[4:]) for t in shaped]
    return [row[:7] + row[8:] for row in (b.row(1) for b in blocks_of(shaped))]


def _logged(step: int, name: str = "loss", *, rank=0, node=None, t=None, value=1.0) -> PointIn:
    return PointIn(
        name, step, value, None if t is False else at(step if t is None else t), node, rank
    )


@pytest.mark.parametrize(
    ("batch", "fast"),
    [
        pytest.param(
            [
                _logged(s, n, rank=r, node=f"n{r}")
                for s in range(300)
                for r in range(2)
                for n in ("loss", "lr")
            ],
            True,
            id="two ranks, 300 steps: two blocks each",
        ),
        pytest.param(
            [_logged(s, "loss") for s in (5, 3, 9)] + [_logged(3, "gn", value=NAN)],
            True,
            id="steps out of order, with a gap and a sparse metric",
        ),
        pytest.param(
            [_logged(s, "loss", t=False) for s in range(4)],
            True,
            id="no times: the time of receipt",
        ),
        pytest.param([_logged(1), _logged(1)], False, id="a step logged twice"),
        pytest.param(
            [_logged(1, "loss"), _logged(1, "lr", t=1.5)], False, id="a step's metrics at two times"
        ),
        pytest.param([_logged(0), _logged(BLOCK_STEP_SPAN)], False, id="a span past the limit"),
    ],
)
def test_a_batch_is_shaped_in_one_pass_exactly_as_the_general_shaping_does(batch, fast):
    received = at(10_000)
    rows = batch_rows(1, batch, received)
    assert (rows is not None) == fast
    if fast:
        assert rows == _general(batch, received)


# --- On PostgreSQL: readers, cursors, races, retention ----------------------------------------


def run(job_id: int, steps: range, *, ranks: int = 2, extra=(), per_batch=10) -> list[PointIn]:
    """Steps logged as the SDK sends them: ``per_batch`` steps a batch, so ingest writes narrow
    blocks (one per rank and node of a batch) for compaction to merge."""
    points = [
        PointIn(name, s, value, at(s * 10.0 + r * 0.001), f"node{r}", r)
        for s in steps
        for r in range(ranks)
        for name, value in (
            ("loss", NAN if s == 777 else 2.0 + math.sin(s / 50) + r * 0.01),
            ("grad_norm", INF if s == 1500 else -INF if s == 1501 else 1.0 + s % 7),
        )
    ]
    points += list(extra)
    # The server's time of receipt (the job's last_metric_at) is the last step's, not today's.
    size = per_batch * ranks * 2
    with time_machine.travel(at(steps[-1] * 10.0 + 1), tick=False):
        for first in range(0, len(points), size):
            store_points(job_id, points[first : first + size])
    return points


def uncompacted_blocks(job_id: int) -> int:
    """Ingest's blocks above the job's compaction cursor."""
    mark = CompactionCursor.objects.filter(job_id=job_id).values_list("cursor", flat=True)
    return MetricBlock.objects.filter(job_id=job_id, last_id__gt=max(mark, default=0)).count()


def evaluated_and_rolled_up(job_id: int, upto: int | None = None) -> None:
    top = max(p.id for p in stored_points(job_id))
    EvaluationState.objects.update_or_create(job_id=job_id, defaults={"cursor": upto or top})
    rollups.roll_up_job(job_id)


def compacted(job_id: int) -> int:
    evaluated_and_rolled_up(job_id)
    return compaction.compact_job(job_id, 0, EvaluationState.objects.get(job_id=job_id).cursor)


def resolved_incident(job_id: int, first_step: int, resolved_step: int) -> None:
    Incident.objects.create(
        job_id=job_id,
        title="spike",
        level="L2",
        opened_at=at(first_step * 10),
        first_step=first_step,
        first_time=at(first_step * 10),
        resolved_at=at(resolved_step * 10),
        status=IncidentStatus.RESOLVED,
    )


def answers(job) -> dict:
    """What every raw reader says of the job."""
    job_id = job.job_id
    grids = [(0, 1, 0, 3000), (0, 7, 100, 2900), (5, 100, 0, 3000), (0, 1, 770, 790)]
    found = {
        "names": metrics.metric_names(job_id),
        "recent": metrics.recent_points([job_id], "loss", 120),
        "between": metrics.points_between(job_id, "grad_norm", 1490, 1510, 100),
        "range": raw_range(job_id, "loss"),
        "step_at": metrics._step_at(job_id, at(1234 * 10.0 + 5)),
    }
    for origin, width, low, high in grids:
        for rank in (0, 1, None):
            for name in ("loss", "grad_norm", "eval_loss"):
                key = f"buckets {name} {rank} {origin}/{width} {low}..{high}"
                found[key] = [
                    (
                        b.index,
                        [(s, round(e, 6), repr(v)) for s, e, v in b.points],
                        b.count,
                        round(b.total, 6),
                        round(b.squares, 6),
                    )
                    for b in fetch_buckets(
                        job_id, name, origin=origin, width=width, low=low, high=high, rank=rank
                    )
                ]
    return found


def latest(job_id: int, user):
    return visible_jobs(user).get(pk=job_id).latest_loss


@pytest.mark.django_db
def test_every_reader_answers_the_same_after_compaction(make_agent, django_user_model):
    agent = make_agent()
    job_id = agent.job_id
    restart = [PointIn("loss", s, 9.0, at(30000 + s), "node0", 0) for s in range(2500, 2600)]
    sparse = [
        PointIn("eval_loss", s, s / 1000, at(s * 10.0 + 3.5), "node0", 0)
        for s in range(0, 3000, 100)
    ]
    run(job_id, range(3000), extra=restart + sparse)
    evaluated_and_rolled_up(job_id)
    user = django_user_model.objects.create(username="reader")
    from incidents.models import Job, Membership

    Membership.objects.create(user=user, team=Job.objects.get(pk=job_id).team, role="viewer")
    before, latest_before = answers(agent), latest(job_id, user)
    raw_points, narrow = len(stored_points(job_id)), uncompacted_blocks(job_id)
    assert narrow >= 2 * 3000 // 10  # a block per rank and batch of ten steps

    compacted = compaction.compact_job(job_id, 0, EvaluationState.objects.get(job_id=job_id).cursor)

    assert compacted == raw_points and uncompacted_blocks(job_id) == 0
    assert 2 * 3000 // BLOCK_COLUMNS <= MetricBlock.objects.filter(job_id=job_id).count() < narrow
    assert answers(agent) == before
    # The highest step of rank 0 (the job's own line; rank 1 logged a millisecond later).
    assert latest(job_id, user) == latest_before == 2.0 + math.sin(2999 / 50)
    cursor = CompactionCursor.objects.get(job_id=job_id)
    assert cursor.points == raw_points and cursor.names == ["eval_loss", "grad_norm", "loss"]


@pytest.mark.django_db
def test_what_the_evaluator_has_not_read_stays_raw(make_agent):
    job_id = make_agent().job_id
    run(job_id, range(1000), ranks=1)  # 100 blocks of 20 points
    ids = sorted({p.id for p in stored_points(job_id)})
    evaluated_and_rolled_up(job_id, upto=ids[29])  # the evaluator is 1,400 points behind
    with time_machine.travel(at(1000 * 10.0 + 601), tick=False):
        done = compaction.compact_all()
    assert done == {job_id: 600}
    left = MetricBlock.objects.filter(job_id=job_id, last_id__gt=ids[29]).order_by("last_id")
    assert list(left.values_list("last_id", flat=True)) == ids[30:]  # ingest's, untouched
    assert CompactionCursor.objects.get(job_id=job_id).cursor == ids[29]


@pytest.mark.django_db
def test_the_live_tail_stays_raw_until_it_is_old_enough(make_agent, settings):
    settings.METRIC_COMPACT_AFTER_SECONDS = 600
    job_id = make_agent().job_id
    run(job_id, range(100), ranks=1)  # steps 0 … 99 at 0 … 990 s, received at 991 s
    evaluated_and_rolled_up(job_id)
    with time_machine.travel(at(599), tick=False):
        assert compaction.compact_all() == {}  # its oldest point is 599 s old: still the tail
    with time_machine.travel(at(601), tick=False):
        assert compaction.compact_all() == {job_id: 200}  # the whole round: (cursor, bound]
        assert compaction.compact_all() == {}  # idempotent
    ahead = [PointIn("loss", s, 1.0, at(2000 + 1800 + s), None, 0) for s in range(100, 200)]
    with time_machine.travel(at(2000), tick=False):  # a clock 30 min ahead of the server's …
        store_points(job_id, ahead)
    evaluated_and_rolled_up(job_id)
    with time_machine.travel(at(2000 + 590), tick=False):
        assert compaction.compact_all() == {}
    with time_machine.travel(at(2000 + 610), tick=False):  # … is compacted once it goes quiet
        assert compaction.compact_all() == {job_id: 100}


@pytest.mark.django_db
def test_a_second_round_with_a_stale_cursor_folds_nothing(make_agent):
    job_id = make_agent().job_id
    run(job_id, range(300), ranks=1)
    evaluated_and_rolled_up(job_id)
    bound = EvaluationState.objects.get(job_id=job_id).cursor
    assert compaction.compact_job(job_id, 0, bound) == 600
    blocks = MetricBlock.objects.filter(job_id=job_id).count()
    # A round that read the cursor before the first committed: it reads the merged blocks, and
    # its compare-and-swap of the cursor refuses them (the whole round rolls back).
    with pytest.raises(compaction.Conflict):
        compaction._compact_chunk(job_id, 0, bound)
    assert MetricBlock.objects.filter(job_id=job_id).count() == blocks
    # One that raced on the same rows: its CAS (or its delete count) refuses, nothing is kept.
    run(job_id, range(300, 400), ranks=1)
    evaluated_and_rolled_up(job_id)
    with pytest.raises(compaction.Conflict), connection.cursor() as cursor:
        compaction._advance(cursor, job_id, 0, bound + 1, ["loss"], 1)
    assert CompactionCursor.objects.get(job_id=job_id).cursor == bound


@pytest.mark.django_db
def test_retention_deletes_blocks_past_the_window_but_never_around_an_incident(
    make_agent, settings
):
    settings.METRIC_RAW_RETENTION_SECONDS = 72 * 3600
    settings.METRIC_INCIDENT_MARGIN_STEPS = 10
    job_id = make_agent().job_id
    run(job_id, range(3000), ranks=1)  # a step every 10 s
    compacted(job_id)
    resolved_incident(job_id, 1000, 1100)
    with time_machine.travel(at(3000 * 10 + 72 * 3600), tick=False):
        pruned = retention.prune()
        assert retention.prune().blocks == 0  # idempotent
    kept = {s for s, _ in metrics.points_between(job_id, "loss", 0, 3000, 10_000)}
    assert set(range(990, 1101)) <= kept  # the freeze: first step − margin to the close
    assert min(kept) >= 990 - BLOCK_COLUMNS and max(kept) < 1101 + BLOCK_COLUMNS  # whole blocks
    assert pruned.blocks > 0 and MetricBlock.objects.filter(job_id=job_id).count() <= 2


@pytest.mark.django_db(transaction=True)
def test_the_real_worker_compacts_through_the_named_task(make_agent, worker, settings):
    from breakers.storage import tasks
    from tests.support.waiting import wait_for
    from tests.support.worker import worker_idle

    settings.METRIC_COMPACT_AFTER_SECONDS = 0  # the points (spring 2026) are old enough
    job_id = make_agent().job_id
    run(job_id, range(500))
    evaluated_and_rolled_up(job_id)
    before = metrics.points_between(job_id, "loss", 0, 499, 1000)
    tasks.compact.delay()
    tasks.compact.delay()  # twice on purpose: a beat firing again folds nothing twice
    wait_for(
        lambda: CompactionCursor.objects.filter(job_id=job_id, cursor__gt=0).exists(),
        "the worker to compact the job",
    )
    wait_for(worker_idle, "the worker to finish")
    assert uncompacted_blocks(job_id) == 0
    assert CompactionCursor.objects.get(job_id=job_id).points == 2 * 2 * 500
    assert metrics.points_between(job_id, "loss", 0, 499, 1000) == before


# Committed blocks, as in production: a partition with the test transaction's pending foreign-key
# checks cannot be dropped.
@pytest.mark.django_db(transaction=True)
def test_blocks_land_in_day_partitions_and_a_day_no_freeze_holds_is_dropped_whole(
    make_agent, settings
):
    from breakers.storage import partitions

    settings.METRIC_RAW_RETENTION_SECONDS = 72 * 3600
    settings.METRIC_INCIDENT_MARGIN_STEPS = 10
    quiet, frozen = make_agent().job_id, make_agent().job_id
    # 10 s a step from T0 (1 March, noon): steps 4,300 … 4,319 are on 1 March, 4,320 … 12,959
    # on the 2nd, 12,960 … 17,779 on the 3rd.
    for job_id in (quiet, frozen):
        store_points(
            job_id,
            [PointIn("loss", s, 1.0, at(s * 10.0), None, 0) for s in range(4300, 17_280 + 500)],
        )
        compacted(job_id)
    march = [T0.date() + timedelta(days) for days in range(3)]
    assert set(march) <= set(partitions.existing())
    resolved_incident(frozen, 17_000, 17_100)
    with time_machine.travel(at(17_780 * 10.0 + 72 * 3600), tick=False):
        pruned = retention.prune()
    # The window ends on 3 March, 13:23: 1 and 2 March go whole, the 3rd holds the freeze.
    assert pruned.block_days == 2
    assert [day in partitions.existing() for day in march] == [False, False, True]
    kept = {s for s, _ in metrics.points_between(frozen, "loss", 0, 20_000, 20_000)}
    assert set(range(16_990, 17_101)) <= kept and min(kept) > 8_000
    assert not metrics.points_between(quiet, "loss", 0, 20_000, 10)  # the rest went by rows


# Committed blocks, as in production: a partition with the test transaction's pending foreign-key
# checks cannot be dropped.
@pytest.mark.django_db(transaction=True)
def test_a_day_written_to_after_its_check_is_not_dropped(make_agent):
    from breakers.storage import partitions

    job_id = make_agent().job_id
    run(job_id, range(100), ranks=1)
    compacted(job_id)
    table = partitions.name_of(T0.date())
    newest = partitions._newest_id(table)
    assert partitions._drop_unless_written(table, newest - 1) is False  # a block came since
    assert T0.date() in partitions.existing()
    assert MetricBlock.objects.filter(job_id=job_id).exists()
    assert partitions._drop_unless_written(table, newest) is True
    assert T0.date() not in partitions.existing()


@pytest.mark.django_db
def test_raw_rows_of_an_upgraded_console_and_new_blocks_are_one_sequence(make_agent):
    """Rows stored one per point before the upgrade, then blocks: the evaluator reads each point
    once, in id order, and compaction folds both."""
    from breakers.detection.evaluation import evaluate_job

    job_id = make_agent().job_id
    rows = [(job_id, "loss", s, at(s * 10.0), 2.0, "node0", 0) for s in range(50)]
    with connection.cursor() as cursor:
        copy_rows(cursor.cursor, rows)
    run(job_id, range(50, 100), ranks=1)
    raw_ids = set(MetricPoint.objects.filter(job_id=job_id).values_list("id", flat=True))
    block_ids = set(MetricBlock.objects.filter(job_id=job_id).values_list("last_id", flat=True))
    assert len(raw_ids) == 50 and max(raw_ids) < min(block_ids)  # one id sequence
    report = evaluate_job(job_id, chunk_size=7)
    assert report.points == 50 + 100 and report.cursor == max(block_ids)
    assert evaluate_job(job_id).points == 0  # exactly once
    rollups.roll_up_job(job_id)
    assert compaction.compact_job(job_id, 0, report.cursor) == 150
    assert not MetricPoint.objects.filter(job_id=job_id).exists()
    assert [p.step for p in stored_points(job_id, "loss")] == list(range(100))
