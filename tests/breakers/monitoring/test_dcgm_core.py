"""DCGM semantics, table by table (pure: runs with -p no:django)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from breakers.detection.detectors import ANOMALOUS, HEALTHY, UNKNOWN, build_detector
from breakers.detection.engine import RuleSpec
from breakers.detection.rulepack import DEFAULT_RULES
from breakers.monitoring import dcgm
from breakers.monitoring.dcgm_detectors import CounterRiseDetector, XidChangeDetector

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "monitoring"


@pytest.mark.parametrize(
    ("code", "level"),
    [
        (48, "L4"),
        (63, "L4"),
        (64, "L4"),
        (74, "L4"),
        (79, "L4"),
        (94, "L4"),
        (95, "L4"),
        (13, "L2"),
        (31, "L2"),
        (43, "L2"),
        (92, "L2"),
        (45, "L1"),
        (61, "L3"),
        (999, "L2"),  # unknown: a warning, not a terminated run
        (0, None),
        (-1, None),
        (79.5, None),
        (math.nan, None),
        (math.inf, None),
    ],
)
def test_xid_levels(code, level):
    assert dcgm.xid_level(code) == level


def test_the_fatal_xids_are_the_documented_ones():
    assert {48, 63, 64, 74, 79, 94, 95} <= set(dcgm.FATAL_XIDS)
    assert all(dcgm.XID_TABLE[c].level == "L4" for c in dcgm.FATAL_XIDS)
    docs = (DEPLOY.parents[1] / "docs" / "monitoring.md").read_text()
    for code, xid in dcgm.XID_TABLE.items():
        assert f"| {code} | {xid.level} |" in docs, f"XID {code} is not documented"
    for source in dcgm.XID_SOURCES:
        assert source.rsplit(" ", 1)[-1] in docs


@pytest.mark.parametrize(
    ("previous", "current", "new"),
    [
        (None, 0.0, False),
        (None, 79.0, True),
        (0.0, 79.0, True),
        (79.0, 79.0, False),
        (79.0, 13.0, True),
        (79.0, 0.0, False),
        (79.0, math.nan, False),
        (None, math.inf, False),
    ],
)
def test_a_new_xid_is_a_change_to_a_new_non_zero_value(previous, current, new):
    assert dcgm.is_new_xid(previous, current) is new


@pytest.mark.parametrize(
    ("previous", "current", "rise"),
    [
        (None, 5.0, False),
        (5.0, 5.0, False),
        (5.0, 6.0, True),
        (6.0, 0.0, False),
        (0.0, 1.0, True),
        (math.nan, 1.0, False),
        (1.0, math.inf, False),
    ],
)
def test_a_counter_error_is_a_rise_and_a_drop_is_a_reset(previous, current, rise):
    assert dcgm.is_rise(previous, current) is rise


@pytest.mark.parametrize(
    ("labels", "value", "level", "action", "layer"),
    [
        (
            {"brakeline_signal": "dcgm-xid", "xid": "79"},
            math.nan,
            "L4",
            "terminate_and_isolate",
            "health",
        ),
        ({"brakeline_signal": "dcgm-xid"}, 13.0, "L2", "none", "health"),
        ({"brakeline_signal": "dcgm-xid"}, math.nan, "L1", "none", "health"),
        ({"brakeline_signal": "dcgm-ecc-dbe"}, 2.0, "L4", "terminate_and_isolate", "health"),
        (
            {"brakeline_signal": "dcgm-uncorrectable-remapped-rows"},
            1.0,
            "L3",
            "checkpoint_and_pause",
            "health",
        ),
        ({"brakeline_signal": "dcgm-power"}, 750.0, "L1", "record", "performance"),
        ({"brakeline_level": "l3"}, 1.0, "L3", "checkpoint_and_pause", "health"),
        ({"brakeline_level": "L9", "severity": "critical"}, 1.0, "L2", "none", "health"),
        ({"severity": "warning"}, 1.0, "L1", "none", "health"),
        ({}, 1.0, "L1", "none", "health"),
        ({"brakeline_signal": "no-such", "brakeline_layer": "bogus"}, 1.0, "L1", "none", "health"),
    ],
)
def test_classify(labels, value, level, action, layer):
    verdict = dcgm.classify("SomeAlert", labels, value)
    assert (verdict.level, verdict.action, verdict.layer) == (level, action, layer)
    assert verdict.rule_key == "alertmanager:SomeAlert"


def feed(detector, values):
    class P:
        def __init__(self, step, value):
            self.name, self.step, self.time, self.value, self.node = (
                "m",
                step,
                float(step),
                value,
                "n",
            )

    return [detector.observe(P(step, v)).state for step, v in enumerate(values)]


def test_xid_change_detector_reads_the_gauge_as_the_last_xid():
    fatal = build_detector("xid_change", {"values": list(dcgm.FATAL_XIDS)})
    states = feed(fatal, [0, 0, 79, 79, 79, 13, 79, math.nan, 79, 0])
    assert states == [
        HEALTHY,
        HEALTHY,
        ANOMALOUS,
        HEALTHY,
        HEALTHY,
        HEALTHY,
        ANOMALOUS,
        UNKNOWN,
        HEALTHY,
        HEALTHY,
    ]
    other = build_detector("xid_change", {"exclude": list(dcgm.FATAL_XIDS)})
    assert feed(other, [0, 79, 13, 13, 31]) == [HEALTHY, HEALTHY, ANOMALOUS, HEALTHY, ANOMALOUS]
    restored = XidChangeDetector(fatal.config)
    restored.load_state(fatal.to_state())
    assert feed(restored, [0]) == [HEALTHY] and restored.previous == 0
    with pytest.raises(ValueError):
        build_detector("xid_change", {"values": ["79"]})


def test_counter_rise_detector():
    detector = build_detector("counter_rise", {})
    assert isinstance(detector, CounterRiseDetector)
    assert feed(detector, [3, 3, 4, 4, 0, 0, 1]) == [
        HEALTHY,
        HEALTHY,
        ANOMALOUS,
        HEALTHY,
        HEALTHY,
        HEALTHY,
        ANOMALOUS,
    ]


def test_the_agent_rule_pack_accepts_the_dcgm_names():
    rules = [RuleSpec.from_dict(spec) for spec in DEFAULT_RULES]
    by_key = {rule.key: rule for rule in rules}
    assert by_key["dcgm-xid-fatal"].matches("DCGM_FI_DEV_XID_ERRORS")
    assert by_key["dcgm-xid-fatal"].matches("DCGM_FI_DEV_XID_ERRORS.gpu3")
    assert by_key["dcgm-xid-fatal"].action == "terminate_and_isolate"
    assert by_key["dcgm-ecc-dbe"].detector == "counter_rise"
    for signal in dcgm.SIGNALS:
        assert any(rule.matches(signal.metric) for rule in rules), signal.metric


def test_the_shipped_rules_name_every_signal_with_its_threshold():
    groups = yaml.safe_load((DEPLOY / "dcgm-rules.yml").read_text())["groups"]
    rules = {r["labels"]["brakeline_signal"]: r for g in groups for r in g["rules"]}
    assert set(rules) == set(dcgm.SIGNALS_BY_KEY)
    for key, rule in rules.items():
        signal = dcgm.SIGNALS_BY_KEY[key]
        assert signal.metric in rule["expr"]
        if signal.reading == dcgm.ABOVE:
            assert f"> {signal.threshold:g}" in rule["expr"]
        if signal.reading == dcgm.COUNTER:
            assert "increase(" in rule["expr"]
