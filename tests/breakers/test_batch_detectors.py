"""Batches judged as arrays answer exactly what the per-point detectors answer.

The reference is `JobEvaluator.feed`, point by point; `feed_batch` must return the same
findings (every field, NaN/±Inf spelled as the protocol spells them), in the same order, and
leave the same detector and episode state behind, on the same series: seeded random losses
with spikes, plateaus, level shifts, NaN and ±Inf, over one rank and many, cut into batches of
varied sizes with ticks between them.
"""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from breakers.detection import arrays
from breakers.detection.batch import PointBatch, feed_batch
from breakers.detection.detectors import DeviationDetector
from breakers.detection.engine import JobEvaluator, Point, RuleSpec
from breakers.detection.rolling import unpack_floats
from breakers.detection.rulepack import default_rules

NAN, INF = math.nan, math.inf
T0 = 1_767_225_600.0


def loss_value(rng: random.Random, step: int, steps: int, rank: int, shape: str) -> float:
    """One rank's loss: noisy decay, with the shape's accident (in the stream's second half,
    after the 500-point window of the L2 rule has filled)."""
    level = 2.0 + 6.0 * math.exp(-step / 400) + 0.1 * rank
    value = level * (1.0 + 0.03 * rng.gauss(0, 1))
    if shape == "plateau" and step >= 300:
        value = 2.5  # flat to the last digit: only the σ floors judge it
    elif shape == "shift" and steps // 2 <= step < steps * 3 // 4:
        value += 3.0 + 1e4 * (step >= steps * 7 // 10)  # a divergence, then a far level
    elif shape == "ramp" and step >= 600:
        value += 0.02 * (step - 600)
    if rng.random() < 0.01:
        value = rng.choice([NAN, INF, -INF, value * 5, 1e200])
    return value


def stream(seed: int, ranks: int, steps: int, shape: str) -> list[Point]:
    """The default pack's metrics from `ranks` ranks, in step order."""
    rng = random.Random(seed)
    points = []
    for step in range(steps):
        time = T0 + step * 2.0
        for rank in range(ranks):
            node = f"node-{rank // 8}"
            loss = loss_value(rng, step, steps, rank, shape)
            grad = NAN if rng.random() < 0.005 else abs(rng.gauss(1.0, 0.2))
            drop = 400.0 if shape == "shift" and step > 700 else 0.0
            points += [
                Point("loss", step, time, loss, node, rank),
                Point("grad_norm", step, time, grad, node, rank),
                Point("throughput", step, time, 1000.0 - drop + rng.gauss(0, 10), node, rank),
                Point("gpu.0.util", step, time, 0.93 + rng.gauss(0, 0.01), node, rank),
                Point("guard.skipped_updates", step, time, float(rng.random() < 0.003), node, rank),
            ]
            if rng.random() < 0.002:
                points.append(Point("gpu.1.xid", step, time, rng.choice([0.0, 13.0, 79.0]), node))
            if rng.random() < 0.001:
                points.append(Point("node.failure", step, time, 1.0, f"node-{rng.randrange(9)}"))
    return points


def small_window_rules() -> list[RuleSpec]:
    """Windows of a few points (a recomputation every few dozen points), both directions, a
    warm-up longer than the window, an inclusive threshold below, a freeze that re-learns."""
    base = {"layer": "stability", "metric": "loss|grad_norm", "severity": "L1"}
    specs = [
        ("dev-both", "deviation", {"k": 1.5, "window": 5, "sustain_points": 2, "grace_points": 1}),
        ("dev-warm", "deviation", {"k": 2.0, "window": 4, "min_points": 7}),
        ("dev-secs", "deviation", {"k": 2.0, "window_seconds": 30.0}),
        (
            "sus-below",
            "sustained",
            {"k": 2.0, "window": 8, "direction": "below", "sustain_points": 3},
        ),
        (
            "sus-freeze",
            "sustained",
            {
                "k": 2.5,
                "window": 6,
                "direction": "above",
                "sustain_points": 2,
                "max_freeze_points": 5,
            },
        ),
        ("thr", "threshold", {"below": 1.0, "above": 9.0, "inclusive": True}),
        ("rise", "rising", {"window": 5, "windows": 2, "min_rise_se": 0.5}),
    ]
    return [
        RuleSpec(key=key, name=key, detector=kind, params=params, clear_after=2, **base)
        for key, kind, params in specs
    ]


def per_point(evaluator: JobEvaluator, batches: list[list[Point]], rearm: bool) -> list[dict]:
    out: list[dict] = []
    for batch in batches:
        for point in batch:
            for finding in evaluator.feed(point):
                out.append(finding.to_dict())
                if rearm:
                    evaluator.rearm(finding.rule_key, finding.node)
        out += [f.to_dict() for f in evaluator.tick(batch[-1].time + 30.0)]
    return out


def batched(evaluator: JobEvaluator, batches: list[list[Point]], rearm: bool) -> list[dict]:
    out: list[dict] = []

    def apply(finding):
        out.append(finding.to_dict())
        if rearm:
            evaluator.rearm(finding.rule_key, finding.node)

    for batch in batches:
        before = len(out)
        returned = feed_batch(evaluator, PointBatch.from_points(batch), apply)
        assert [f.to_dict() for f in returned] == out[before:]  # returned as applied
        out += [f.to_dict() for f in evaluator.tick(batch[-1].time + 30.0)]
    return out


def cut(points: list[Point], seed: int) -> list[list[Point]]:
    """Batches of varied sizes: a lone point, a few, thousands."""
    rng = random.Random(seed)
    batches, i = [], 0
    while i < len(points):
        size = rng.choice([1, 3, 50, 700, 3000])
        batches.append(points[i : i + size])
        i += size
    return batches


def both(rules, points: list[Point], seed: int, rearm: bool = False):
    batches = cut(points, seed)
    reference, candidate = JobEvaluator(rules()), JobEvaluator(rules())
    expected = per_point(reference, batches, rearm)
    got = batched(candidate, batches, rearm)
    state = json.dumps(reference.to_state(), allow_nan=False)
    return expected, got, state, json.dumps(candidate.to_state(), allow_nan=False)


CASES = [
    # (seed, ranks, steps, shape)
    (1, 1, 3000, "noise"),
    (2, 1, 2000, "shift"),
    (3, 1, 1500, "plateau"),
    (4, 1, 1600, "ramp"),
    (5, 16, 300, "shift"),
    (6, 200, 12, "noise"),
    (7, 1000, 3, "noise"),
]


@pytest.mark.parametrize(("seed", "ranks", "steps", "shape"), CASES)
def test_default_pack_batches_answer_as_the_per_point_detectors(seed, ranks, steps, shape):
    points = stream(seed, ranks, steps, shape)
    expected, got, state, got_state = both(default_rules, points, seed)
    assert got == expected
    assert got_state == state


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("shape", ["noise", "shift", "plateau"])
def test_small_windows_and_every_option_answer_alike(seed, shape):
    points = stream(seed, 3, 900, shape)
    expected, got, state, got_state = both(small_window_rules, points, seed)
    assert got == expected
    assert got_state == state
    assert {f["rule_key"] for f in expected} >= {"dev-both", "sus-below", "thr", "rise"}


def test_a_rearm_between_findings_holds_for_the_rest_of_the_batch():
    """Evaluation re-arms a rule whose point was logged before a resume: the next anomalous
    point of the same batch fires again, as it would between two `feed` calls."""
    points = stream(21, 4, 600, "shift")
    expected, got, state, got_state = both(default_rules, points, 21, rearm=True)
    assert got == expected
    assert got_state == state
    fired = [f["rule_key"] for f in expected if f["kind"] == "fire"]
    assert len(fired) > len(set(fired))  # the re-armed rules fired more than once


def test_the_default_pack_streams_fire_every_kind_of_rule():
    """The table above is not vacuous: its streams fire and clear the pack's rules."""
    findings = []
    for seed, ranks, steps, shape in CASES[:5]:
        findings += per_point(
            JobEvaluator(default_rules()), cut(stream(seed, ranks, steps, shape), seed), False
        )
    fired = {f["rule_key"] for f in findings if f["kind"] == "fire"}
    assert {
        "loss-deviation",
        "loss-sustained-deviation",
        "loss-rising",
        "non-finite-loss-or-gradients",
        "update-refused-by-guard",
        "throughput-drop",
    } <= fired
    assert any(f["kind"] == "clear" for f in findings)
    assert any(f["value"] in ("NaN", "Infinity", "-Infinity") for f in findings)


def test_a_resumed_state_judged_as_arrays_continues_exactly():
    points = stream(31, 2, 1200, "noise")
    expected = per_point(JobEvaluator(default_rules()), [points], False)
    first = JobEvaluator(default_rules())
    head = per_point(first, [points[:1337]], False)
    resumed = JobEvaluator.from_state(default_rules(), json.loads(json.dumps(first.to_state())))
    tail = batched(resumed, [points[1337:]], False)
    # The tick after the head is the only extra: everything else equals one long run.
    assert [f for f in head + tail if f not in expected] == []


@pytest.mark.parametrize("ranks", [1, 40])
def test_the_arrays_take_the_plain_stretches(monkeypatch, ranks):
    """Most points of quiet series are judged by the arrays, not by `observe`."""
    evaluator = JobEvaluator(default_rules())
    points = [p for p in stream(41, ranks, 1200, "noise") if p.name == "loss"]
    calls = []
    observe = DeviationDetector.observe
    monkeypatch.setattr(
        DeviationDetector, "observe", lambda self, point: calls.append(1) or observe(self, point)
    )
    feed_batch(evaluator, PointBatch.from_points(points))
    assert len(calls) < 2 * len(points) // 10  # two rolling rules on the loss


def test_threshold_and_non_finite_codes():
    values = np.array([NAN, INF, -INF, 0.0, 1.0, -1.0])
    params = {"above": 0.0, "inclusive": True}
    config = RuleSpec("t", "t", "health", "m", "threshold", params).config
    assert arrays.threshold_codes(config, values).tolist() == [0, 4, 1, 4, 4, 1]
    assert arrays.non_finite_codes(values).tolist() == [4, 4, 4, 1, 1, 1]


def test_windows_travel_packed_and_the_former_lists_still_load():
    """A rolling window is stored as base64 of its doubles (exact, NaN-free by construction);
    a state written as a JSON list of numbers resumes identically."""
    evaluator = JobEvaluator(default_rules())
    feed_batch(evaluator, PointBatch.from_points(stream(51, 2, 700, "noise")))
    state = json.loads(json.dumps(evaluator.to_state(), allow_nan=False))
    windows = [e["detector"]["stats"] for e in state["series"] if "stats" in e["detector"]]
    assert windows and all(isinstance(w["values"], str) for w in windows)
    as_lists = json.loads(json.dumps(state))
    for entry in as_lists["series"]:
        stats = entry["detector"].get("stats")
        if stats:
            stats["values"] = list(unpack_floats(stats["values"]))
            stats["times"] = list(unpack_floats(stats["times"]))
    again = JobEvaluator.from_state(default_rules(), as_lists).to_state()
    assert json.dumps(again) == json.dumps(state)
    tail = stream(52, 2, 300, "shift")
    a = JobEvaluator.from_state(default_rules(), state)
    b = JobEvaluator.from_state(default_rules(), as_lists)
    assert per_point(a, [tail], False) == per_point(b, [tail], False)
