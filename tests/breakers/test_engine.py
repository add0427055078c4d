"""The pure breaker engine: rules as data, edge triggering, hysteresis, state round trip."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

import pytest

from breakers.detection.engine import Finding, JobEvaluator, Point, RuleSpec, parse_value
from breakers.detection.rulepack import default_rules


def threshold_rule(**changes):
    base = dict(
        key="xid",
        name="GPU XID",
        layer="health",
        metric="gpu.*.xid",
        detector="threshold",
        params={"above": 0.0},
        severity="L4",
        action="terminate_and_isolate",
        action_params={"isolate": True},
        runbook="hardware-error",
    )
    base.update(changes)
    return RuleSpec(**base)


def feed_values(evaluator, values, name="gpu.0.xid", node=None, start=0):
    findings = []
    for offset, value in enumerate(values):
        step = start + offset
        findings += evaluator.feed(Point(name, step, 1000.0 + step, value, node))
    return findings


# --------------------------------------------------------------------------- RuleSpec


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"layer": "network"}, "layer must be"),
        ({"severity": "L5"}, "severity must be"),
        ({"action": "reboot"}, "action must be"),
        ({"layer": "performance", "action": "lower_lr"}, "only record"),
        ({"params": {"abov": 1.0}}, "rule xid: threshold"),
        ({"detector": "magic"}, "unknown detector kind"),
        ({"metric": " | "}, "selector is empty"),
        ({"clear_after": 0}, "clear_after"),
        ({"key": ""}, "non-empty string key"),
    ],
)
def test_invalid_rules_are_refused(changes, message):
    with pytest.raises(ValueError, match=message):
        threshold_rule(**changes)


def test_performance_rules_only_record():
    rule = threshold_rule(layer="performance", action="none", severity="L1")
    assert rule.action == "record"
    evaluator = JobEvaluator([rule])
    (finding,) = feed_values(evaluator, [0.0, 3.0])
    assert finding.action == "record"


@pytest.mark.parametrize(
    ("selector", "name", "matches"),
    [
        ("gpu.*.temp", "gpu.3.temp", True),
        ("gpu.*.temp", "gpu.3.util", False),
        ("gpu.*.temp", "GPU.3.temp", False),
        ("loss|grad_norm", "grad_norm", True),
        ("loss|grad_norm", "loss_scale", False),
        ("loss", "val.loss", False),
        ("perf.*", "perf.data_wait", True),
    ],
)
def test_metric_selectors(selector, name, matches):
    assert threshold_rule(metric=selector).matches(name) is matches


def test_rule_dict_round_trip_and_unknown_fields():
    rule = threshold_rule(per_node=True, clear_after=3)
    assert RuleSpec.from_dict(json.loads(json.dumps(rule.to_dict()))) == rule
    with pytest.raises(ValueError, match="unknown rule fields: colour"):
        RuleSpec.from_dict({**rule.to_dict(), "colour": "red"})


def test_duplicate_rule_keys_are_refused():
    with pytest.raises(ValueError, match="duplicate rule key"):
        JobEvaluator([threshold_rule(), threshold_rule()])


# --------------------------------------------------------------------------- edge triggering


def test_fire_once_stay_quiet_then_clear_once():
    evaluator = JobEvaluator([threshold_rule(clear_after=2)])
    findings = feed_values(evaluator, [0, 79, 79, 13, 0, 0, 0, 31], node="node-7")
    assert [(f.kind, f.step) for f in findings] == [("fire", 1), ("clear", 5), ("fire", 7)]
    fire, clear, _ = findings
    assert fire.severity == "L4" and fire.layer == "health"
    assert fire.action == "terminate_and_isolate" and fire.action_params == {"isolate": True}
    assert (fire.metric, fire.node, fire.nodes) == ("gpu.0.xid", "node-7", ("node-7",))
    assert (fire.value, fire.threshold) == (79.0, 0.0)
    assert (fire.first_step, fire.first_time, fire.duration_seconds) == (1, 1001.0, 0.0)
    assert fire.description == "gpu.0.xid 79 is above the threshold 0"
    assert fire.runbook == "hardware-error"
    assert clear.action == "none" and clear.action_params == {}
    assert (clear.first_step, clear.duration_steps, clear.duration_seconds) == (1, 4, 4.0)
    assert "back to normal" in clear.description


def test_hysteresis_stops_a_flapping_metric_from_paging_repeatedly():
    flapping = [0, 5] * 20
    quiet = JobEvaluator([threshold_rule(clear_after=3)])
    assert [f.kind for f in feed_values(quiet, flapping)] == ["fire"]
    eager = JobEvaluator([threshold_rule(clear_after=1)])
    assert len(feed_values(eager, flapping)) == 39  # 20 fires and 19 clears


def test_clear_after_seconds():
    evaluator = JobEvaluator([threshold_rule(clear_after=1, clear_after_seconds=5.0)])
    findings = feed_values(evaluator, [1, 0, 0, 0, 0, 0, 0, 0])
    assert [(f.kind, f.step) for f in findings] == [("fire", 0), ("clear", 6)]


def test_nan_has_no_opinion_for_a_threshold_and_does_not_clear():
    evaluator = JobEvaluator([threshold_rule(clear_after=1)])
    findings = feed_values(evaluator, [1, math.nan, math.nan, 0])
    assert [(f.kind, f.step) for f in findings] == [("fire", 0), ("clear", 3)]


def test_pending_resets_the_healthy_streak():
    rule = RuleSpec(
        key="dev",
        name="dev",
        layer="stability",
        metric="loss",
        detector="deviation",
        params={"k": 3.0, "window": 20, "sustain_points": 3, "baseline": "freeze"},
        severity="L1",
        clear_after=3,
    )
    evaluator = JobEvaluator([rule])
    base = [10.0 + 0.1 * ((i * 7) % 5 - 2) for i in range(20)]
    findings = feed_values(
        evaluator, base + [20.0] * 3 + [10.0, 10.0, 20.0, 10.0, 10.0, 10.0], name="loss"
    )
    # Fires on the 3rd deviating point; the deviating point at step 25 (pending) restarts
    # the count of healthy points, so the clear comes at 28, not 26.
    assert [(f.kind, f.step) for f in findings] == [("fire", 22), ("clear", 28)]
    assert findings[0].first_step == 20


def test_state_is_kept_per_node_only_when_the_rule_says_so():
    per_node = JobEvaluator([threshold_rule(per_node=True)])
    pooled = JobEvaluator([threshold_rule(per_node=False)])
    for evaluator, expected in ((per_node, 2), (pooled, 1)):
        findings = feed_values(evaluator, [1.0], node="a") + feed_values(
            evaluator, [1.0], node="b", start=1
        )
        assert len(findings) == expected


def test_state_is_kept_per_metric_unless_pooled():
    rule = threshold_rule(metric="gpu.*.xid")
    evaluator = JobEvaluator([rule])
    findings = feed_values(evaluator, [1.0], name="gpu.0.xid")
    findings += feed_values(evaluator, [1.0], name="gpu.1.xid", start=1)
    assert [f.metric for f in findings] == ["gpu.0.xid", "gpu.1.xid"]
    pooled = JobEvaluator([replace(rule, per_metric=False)])
    findings = feed_values(pooled, [1.0], name="gpu.0.xid")
    findings += feed_values(pooled, [1.0], name="gpu.1.xid", start=1)
    assert len(findings) == 1


def test_disabled_rules_are_not_evaluated():
    evaluator = JobEvaluator([threshold_rule(enabled=False)])
    assert feed_values(evaluator, [5.0, 6.0]) == []


def test_silence_fires_on_tick_and_clears_when_points_return():
    rule = RuleSpec(
        key="hb",
        name="Heartbeat timeout",
        layer="health",
        metric="heartbeat",
        detector="silence",
        params={"timeout": 30.0},
        per_node=True,
        severity="L3",
        action="checkpoint_and_pause",
    )
    evaluator = JobEvaluator([rule])
    assert evaluator.tick(0.0) == []
    evaluator.feed(Point("heartbeat", 4512, 100.0, 1.0, "node-1"))
    assert evaluator.tick(120.0) == []
    (fire,) = evaluator.tick(140.0)
    assert (fire.kind, fire.severity, fire.action) == ("fire", "L3", "checkpoint_and_pause")
    assert (fire.step, fire.first_step, fire.node, fire.time) == (4512, 4512, "node-1", 140.0)
    assert (fire.value, fire.threshold, fire.duration_seconds) == (40.0, 30.0, 40.0)
    assert "silent for 40 s" in fire.description
    assert evaluator.tick(150.0) == []  # still silent: no spam
    (clear,) = evaluator.feed(Point("heartbeat", 4513, 160.0, 1.0, "node-1"))
    assert clear.kind == "clear"


def test_sustained_finding_carries_the_start_of_the_episode():
    rules = [r for r in default_rules() if r.key == "loss-sustained-deviation"]
    evaluator = JobEvaluator(rules)
    rng = random.Random(2)
    values = [2.0 + 0.05 * rng.gauss(0, 1) for _ in range(600)]
    values += [3.0 + 0.05 * rng.gauss(0, 1) for _ in range(700)]
    (fire,) = feed_values(evaluator, values, name="loss")
    assert (fire.first_step, fire.step) == (600, 1200)
    assert fire.duration_seconds == 600.0 and fire.duration_steps == 600
    assert fire.action == "lower_lr" and fire.action_params == {"factor": 0.5}
    assert "above its 500-step mean 2.0" in fire.description
    assert "beyond 4σ since step 600" in fire.description
    assert 2.1 < fire.threshold < 2.3


# --------------------------------------------------------------------------- state


def varied_points(n=3000, seed=4):
    rng = random.Random(seed)
    points = []
    for step in range(n):
        time = 1_700_000_000.0 + step
        loss = 2.0 + 0.05 * rng.gauss(0, 1) + (0.8 if 1200 <= step < 2000 else 0.0)
        if step > 2400:
            loss += 0.01 * (step - 2400)
        if step in (2700, 2701):
            loss = math.nan
        points.append(Point("loss", step, time, loss))
        points.append(Point("grad_norm", step, time, abs(rng.gauss(1, 0.1))))
        if step % 10 == 0 and not 1500 <= step < 1800:
            points.append(Point("heartbeat", step, time, 1.0, f"node-{step % 20 // 10}"))
        if step in (1000, 1030):
            points.append(Point("node.failure", step, time, 1.0, f"node-{step % 7}"))
        points.append(
            Point(
                "throughput", step, time, 900.0 - (300.0 if step > 2500 else 0.0) + rng.gauss(0, 5)
            )
        )
    return points


def drive(evaluator, points):
    out = []
    for point in points:
        out += [f.to_dict() for f in evaluator.feed(point)]
        if point.name == "loss" and point.step % 5 == 0:
            out += [f.to_dict() for f in evaluator.tick(point.time + 0.5)]
    return out


@pytest.mark.parametrize("split", [10, 1111, 2222, 5678, 9000])
def test_evaluator_round_trip_mid_stream_equals_uninterrupted_run(split):
    points = varied_points()
    expected = drive(JobEvaluator(default_rules()), points)
    first = JobEvaluator(default_rules())
    head = drive(first, points[:split])
    stored = json.dumps(first.to_state(), allow_nan=False)
    resumed = JobEvaluator.from_state(default_rules(), json.loads(stored))
    assert head + drive(resumed, points[split:]) == expected


def test_the_varied_stream_fires_several_rules():
    findings = drive(JobEvaluator(default_rules()), varied_points())
    fired = {f["rule_key"] for f in findings if f["kind"] == "fire"}
    assert {
        "loss-deviation",
        "loss-sustained-deviation",
        "loss-rising",
        "non-finite-loss-or-gradients",
        "nodes-failing",
        "throughput-drop",
    } <= fired


def test_restore_with_a_changed_rule_keeps_the_episode_and_restarts_the_detector():
    evaluator = JobEvaluator([threshold_rule()])
    feed_values(evaluator, [5.0])
    state = evaluator.to_state()
    changed = threshold_rule(params={"above": 10.0})
    resumed = JobEvaluator.from_state([changed], state)
    assert resumed.open_episodes() == [
        {
            "rule": "xid",
            "metric": "gpu.0.xid",
            "node": None,
            "rank": 0,
            "first_step": 0,
            "first_time": 1000.0,
        }
    ]
    # The detector restarted under the new threshold: 7 is healthy now and clears the episode.
    (clear,) = feed_values(resumed, [7.0], start=1)
    assert (clear.kind, clear.first_step) == ("clear", 0)
    assert resumed.open_episodes() == []


def test_restore_without_the_rule_reports_orphaned_episodes():
    evaluator = JobEvaluator([threshold_rule()])
    feed_values(evaluator, [5.0])
    resumed = JobEvaluator.from_state([], evaluator.to_state())
    assert resumed.orphaned == [
        {
            "rule": "xid",
            "metric": "gpu.0.xid",
            "node": None,
            "rank": 0,
            "first_step": 0,
            "first_time": 1000.0,
        }
    ]
    regrouped = JobEvaluator.from_state([threshold_rule(per_metric=False)], evaluator.to_state())
    assert len(regrouped.orphaned) == 1 and regrouped.open_episodes() == []


def test_unknown_state_version_is_refused():
    with pytest.raises(ValueError, match="state version"):
        JobEvaluator.from_state([], {"version": 99, "series": []})


# --------------------------------------------------------------------------- wire formats


def test_finding_to_dict_is_strict_json_and_round_trips():
    rule = RuleSpec(
        key="nan",
        name="NaN",
        layer="stability",
        metric="loss",
        detector="non_finite",
        severity="L3",
        action="checkpoint_and_pause",
    )
    (fire,) = JobEvaluator([rule]).feed(Point("loss", 4512, 5.0, math.nan, "node-2"))
    assert fire.description == "loss is NaN at step 4512"
    data = json.loads(json.dumps(fire.to_dict(), allow_nan=False))
    assert data["value"] == "NaN" and data["threshold"] is None and data["nodes"] == ["node-2"]
    again = Finding.from_dict(data)
    assert math.isnan(again.value)
    assert replace(again, value=0.0) == replace(fire, value=0.0)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(2.5, 2.5), (3, 3.0), ("Infinity", math.inf), ("-Infinity", -math.inf)],
)
def test_parse_value(raw, expected):
    assert parse_value(raw) == expected


@pytest.mark.parametrize("raw", [True, "2.5", "nan", None, [1]])
def test_parse_value_refuses(raw):
    with pytest.raises(ValueError):
        parse_value(raw)


def test_point_from_agent_protocol_dict():
    point = Point.from_dict(
        {
            "name": "loss",
            "step": 120,
            "value": "NaN",
            "time": "2026-01-01T00:00:00Z",
            "node": "node-07",
        },
        default_time=0.0,
    )
    assert (point.name, point.step, point.time, point.node) == (
        "loss",
        120,
        1767225600.0,
        "node-07",
    )
    assert math.isnan(point.value)
    assert Point.from_dict({"name": "lr", "step": 1, "value": 1e-4}, 42.0).time == 42.0
