"""The pure engine on multi-rank jobs: one series per rank, findings naming their rank.

Each scenario is also replayed with every point relabelled rank 0 — the engine as it was when
it pooled a job's ranks into one series — to show what the per-rank series change: a constant
offset between ranks arriving in per-rank batches fired the spike rule, while a spike or a
rise on one rank was hidden in the ranks' mix.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest

from breakers.detection.engine import JobEvaluator, Point, RuleSpec
from breakers.detection.rulepack import default_rules

T0 = 1_767_225_600.0
STEPS = 600

SPIKE = RuleSpec(
    key="loss-spike",
    name="Loss spike",
    layer="stability",
    metric="loss",
    detector="deviation",
    params={"k": 6.0, "window": 100},
    severity="L1",
    clear_after=5,
)
RISING = RuleSpec(
    key="loss-rising",
    name="Loss rising",
    layer="stability",
    metric="loss",
    detector="rising",
    params={"window": 20, "windows": 4, "min_rise_se": 2.0},
    severity="L3",
)
NON_FINITE = next(r for r in default_rules() if r.key == "non-finite-loss-or-gradients")
RULES = [SPIKE, RISING, NON_FINITE]


def flat(rank: int, step: int) -> float:
    return 2.0 + 0.5 * rank  # rank 1's shard has a higher loss: a constant offset


def spike_on_rank_1(rank: int, step: int) -> float:
    return flat(rank, step) + (0.5 if rank == 1 and step == 300 else 0.0)


def rising_on_rank_1(rank: int, step: int) -> float:
    # Rank 1 climbs while rank 0 falls as fast: the ranks' mean stays flat.
    drift = 0.002 * max(0, step - 200)
    return flat(rank, step) + (drift if rank == 1 else -drift)


def nan_on_rank_1(rank: int, step: int) -> float:
    return math.nan if rank == 1 and step == 400 else flat(rank, step)


def stream(curve, ranks=(0, 1), batch=1, seed=7) -> list[Point]:
    """Both ranks' losses with N(0, 0.01) noise, in arrival order: each rank posts `batch`
    steps at a time in turn (batch=1: interleaved step by step)."""
    rng = random.Random(seed)
    points = []
    for first in range(0, STEPS, batch):
        for rank in ranks:
            for step in range(first, min(first + batch, STEPS)):
                value = curve(rank, step) + 0.01 * rng.gauss(0, 1)
                points.append(Point("loss", step, T0 + step, value, None, rank))
    return points


def pooled(points: list[Point]) -> list[Point]:
    return [replace(point, rank=0) for point in points]


def fired(points: list[Point], rules=RULES) -> set[tuple[str, int | None]]:
    """The (rule, rank) series that fired at least once."""
    findings = JobEvaluator(rules).feed_many(points)
    return {(f.rule_key, f.rank) for f in findings if f.kind == "fire"}


def fires(findings):
    return [f for f in findings if f.kind == "fire"]


@pytest.mark.parametrize(
    ("curve", "batch", "per_rank", "when_pooled"),
    [
        # Losses differing by a constant are two healthy curves, however they arrive.
        (flat, 1, [], []),
        (flat, 100, [], [("loss-spike", 0)]),
        # A spike or a rise on one rank is that rank's finding, named.
        (spike_on_rank_1, 1, [("loss-spike", 1)], []),
        (rising_on_rank_1, 1, [("loss-rising", 1)], []),
        (
            nan_on_rank_1,
            1,
            [("non-finite-loss-or-gradients", 1)],
            [("non-finite-loss-or-gradients", 0)],
        ),
    ],
    ids=["offset-interleaved", "offset-in-rank-batches", "spike-rank-1", "rising-rank-1", "nan"],
)
def test_each_rank_is_a_series_of_its_own(curve, batch, per_rank, when_pooled):
    points = stream(curve, batch=batch)
    assert fired(points) == set(per_rank)
    assert fired(pooled(points)) == set(when_pooled)


def test_a_finding_of_a_multi_rank_job_names_its_rank():
    fire, clear = JobEvaluator(RULES).feed_many(stream(spike_on_rank_1))
    assert (fire.kind, fire.rank, fire.step) == ("fire", 1, 300)
    assert fire.description.startswith("rank 1: loss ")
    assert (clear.kind, clear.rank, clear.step) == ("clear", 1, 305)  # clear_after 5
    assert clear.description.startswith("rank 1: loss back to normal")
    assert clear.to_dict()["rank"] == 1


def test_a_single_process_job_reads_as_before():
    (fire,) = fires(JobEvaluator(RULES).feed_many(stream(spike_on_rank_1, ranks=(1,))))
    assert fire.rank == 1 and fire.description.startswith("rank 1: ")  # rank 1 alone: named
    points = [replace(p, rank=0) for p in stream(spike_on_rank_1, ranks=(1,))]
    (fire,) = fires(JobEvaluator(RULES).feed_many(points))
    assert fire.rank == 0 and fire.description.startswith("loss ")


def test_node_failure_counts_pool_the_ranks():
    rule = next(r for r in default_rules() if r.key == "nodes-failing")
    evaluator = JobEvaluator([rule])
    assert evaluator.feed(Point("node.a.failure", 5, T0, 1.0, None, 0)) == []
    (fire,) = evaluator.feed(Point("node.b.failure", 5, T0 + 1, 1.0, None, 1))
    assert (fire.rank, fire.nodes) == (None, ("node.a.failure", "node.b.failure"))
    assert not fire.description.startswith("rank")


def test_a_rank_that_goes_silent_fires_for_that_rank():
    rule = RuleSpec(
        key="loss-silent",
        name="Loss silent",
        layer="health",
        metric="loss",
        detector="silence",
        params={"timeout": 30.0},
        severity="L3",
    )
    evaluator = JobEvaluator([rule])
    for step in range(10):
        evaluator.feed(Point("loss", step, T0 + step, 2.0, None, 0))
        if step < 5:
            evaluator.feed(Point("loss", step, T0 + step, 2.5, None, 1))
    assert evaluator.tick(T0 + 33) == []  # rank 1's last point was at T0 + 4: 29 s
    (fire,) = evaluator.tick(T0 + 35)  # rank 1 silent for 31 s, rank 0 (T0 + 9) for 26 s
    assert (fire.rank, fire.step) == (1, 4)
    assert fire.description.startswith("rank 1: loss silent for 31 s")


def test_round_trip_mid_stream_keeps_every_rank_s_state():
    points = stream(rising_on_rank_1, batch=50)
    whole = JobEvaluator(RULES).feed_many(points)
    first = JobEvaluator(RULES)
    findings = first.feed_many(points[:500])
    state = json.loads(json.dumps(first.to_state(), allow_nan=False))
    assert state["version"] == 3
    assert {(s["rule"], s["rank"]) for s in state["series"]} >= {
        ("loss-spike", 0),
        ("loss-spike", 1),
    }
    resumed = JobEvaluator.from_state(RULES, state)
    assert resumed.multi_rank
    findings += resumed.feed_many(points[500:])
    assert [f.to_dict() for f in findings] == [f.to_dict() for f in whole]


def version_1(state: dict) -> dict:
    """A state as the engine wrote it before ranks: no rank in the series keys."""
    series = [{k: v for k, v in entry.items() if k != "rank"} for entry in state["series"]]
    return {"version": 1, "series": series}


def test_a_state_from_before_ranks_resumes_as_rank_0():
    single = [p for p in stream(nan_on_rank_1, ranks=(0,))][:300]
    evaluator = JobEvaluator(RULES)
    evaluator.feed_many(single)
    (fire,) = evaluator.feed(Point("loss", 300, T0 + 300, math.nan))
    resumed = JobEvaluator.from_state(RULES, version_1(evaluator.to_state()))
    (episode,) = resumed.open_episodes()
    assert (episode["rule"], episode["rank"], episode["first_step"]) == (fire.rule_key, 0, 300)
    # The spike rule's warmed-up baseline came along: a spike fires at once, on rank 0.
    (spike,) = resumed.feed(Point("loss", 301, T0 + 301, 3.0))
    assert (spike.rule_key, spike.rank) == ("loss-spike", 0)
    gone = JobEvaluator.from_state([SPIKE], version_1(evaluator.to_state()))
    assert [(o["rule"], o["rank"]) for o in gone.orphaned] == [(NON_FINITE.key, 0)]


def test_a_pooled_series_stored_with_a_rank_is_refitted():
    rule = next(r for r in default_rules() if r.key == "nodes-failing")
    evaluator = JobEvaluator([rule])
    evaluator.feed(Point("node.a.failure", 5, T0, 1.0, None, 0))
    evaluator.feed(Point("node.b.failure", 5, T0 + 1, 1.0, None, 1))
    state = evaluator.to_state()
    assert [s["rank"] for s in state["series"]] == [None]
    per_metric = replace(rule, per_metric=True)
    regrouped = JobEvaluator.from_state([per_metric], state)
    assert [(o["metric"], o["rank"]) for o in regrouped.orphaned] == [("*", None)]
    assert regrouped.open_episodes() == []
