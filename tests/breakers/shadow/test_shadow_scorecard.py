"""A drill's scorecard lists what the shadow rules would have done, and never judges it
(pure: -p no:django)."""

from __future__ import annotations

from breakers.drills.scenarios import SCENARIOS
from breakers.drills.scorecard import Facts, score, shadow_line

FIRING = {
    "rule_key": "loss-nan-observed",
    "severity": "L3",
    "action": "checkpoint_and_pause",
    "first_step": 40,
    "fired_step": 40,
    "ranks": [0],
    "after_s": 0.8,
}


def test_the_shadow_line_says_what_would_have_fired():
    line = shadow_line(Facts(fault_step=40, shadow=[FIRING, {**FIRING, "fired_step": 44}]))
    assert line.passed and line.measured == "2 would have fired"
    assert line.detail == (
        "loss-nan-observed: L3 checkpoint_and_pause at step 40, 0.80 s after the fault; "
        "loss-nan-observed: L3 checkpoint_and_pause at step 44, 0.80 s after the fault"
    )


def test_the_scorecard_has_the_line_only_when_a_shadow_rule_fired():
    scenario = next(iter(SCENARIOS.values()))
    names = [line.name for line in score(scenario, Facts(fault_step=40))]
    assert "shadow rules" not in names
    names = [line.name for line in score(scenario, Facts(fault_step=40, shadow=[FIRING]))]
    assert names[-1] == "shadow rules"
