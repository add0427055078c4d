"""The scorecard's budgets, read from the rule that answered (pure, no database): the rule's
own delay from the drill's rule-set version plus the loaded-machine margin; and the lines of a
brake whose save was meant to fail."""

from __future__ import annotations

import pytest

from breakers.detection.rulepack import DEFAULT_RULES
from breakers.drills.scenarios import SCENARIOS
from breakers.drills.scorecard import (
    DETECT_MARGIN_SECONDS,
    DETECT_MARGIN_STEPS,
    Facts,
    brake_line,
    checkpoint_lines,
    detect_budget,
    detect_line,
    release_line,
    timeline_line,
)

PACK = {rule["key"]: rule for rule in DEFAULT_RULES}
M, N = DETECT_MARGIN_SECONDS, DETECT_MARGIN_STEPS


@pytest.mark.parametrize(
    ("key", "rule", "heartbeat", "seconds", "steps"),
    [
        ("non-finite-loss-or-gradients", PACK["non-finite-loss-or-gradients"], None, M, N),
        ("hardware-error", PACK["hardware-error"], None, M, N),
        ("loss-deviation", PACK["loss-deviation"], None, M, 3 + N),  # sustain_points 4
        ("loss-rising", PACK["loss-rising"], None, M, 250 + N),  # 5 windows of 50
        ("loss-sustained-deviation", PACK["loss-sustained-deviation"], None, 600 + M, N),
        ("nodes-failing", PACK["nodes-failing"], None, 60 + M, N),  # window_seconds
        ("heartbeat-timeout", None, 12.5, 12.5 + M, N),  # the watchdog's deadline
        ("a-team-rule", {"params": {"sustain_seconds": 2.0}}, None, 2.0 + M, N),
        ("a-rule-gone-since", None, None, M, N),  # not in the version: no delay of its own
    ],
)
def test_the_detect_budget_is_the_rules_own_delay_plus_the_margin(
    key, rule, heartbeat, seconds, steps
):
    budget = detect_budget(key, rule, heartbeat)
    assert (budget.seconds, budget.steps) == (pytest.approx(seconds), steps)
    assert f"+ {M:g} s, {N} steps margin" in budget.expectation()


@pytest.mark.parametrize(
    ("key", "rule", "heartbeat", "forgiven", "seconds"),
    [
        ("heartbeat-timeout", None, 12.5, 5.4, 12.5 + 5.4 + M),  # deadlines moved by as much
        ("heartbeat-timeout", None, 12.5, 0.0, 12.5 + M),
        ("non-finite-loss-or-gradients", PACK["non-finite-loss-or-gradients"], None, 5.4, M),
        ("a-team-rule", {"params": {"sustain_seconds": 2.0}}, None, 5.4, 2.0 + M),
    ],
)
def test_the_watchdogs_budget_adds_the_deafness_the_console_forgave(
    key, rule, heartbeat, forgiven, seconds
):
    """A silence the console could not hear is not the job's: the watchdog's deadline ran that
    much later, so the hang's detection is judged against it. A rule on the job's points does
    not wait on deadlines, and its budget stays."""
    budget = detect_budget(key, rule, heartbeat, forgiven)
    assert budget.seconds == pytest.approx(seconds)
    said = f"+ {forgiven:.1f} s the console forgave (its own deafness)"
    assert (said in budget.expectation()) == (key == "heartbeat-timeout" and forgiven > 0)


def test_the_line_shows_the_expectation_it_was_judged_against():
    facts = Facts(fault_step=100, rule={"params": {"sustain_seconds": 2.0}})
    facts.alert = {"rule_key": "r", "severity": "L3", "detect_s": 11.9, "first_step": 102}
    line = detect_line(SCENARIOS["nan_loss"], facts)
    assert line.passed
    assert line.expectation == (
        f"≤ 12.0 s and ≤ 3 steps after the fault: rule r's 2.0 s, 0 steps + {M:g} s, "
        f"{N} steps margin"
    )
    facts.alert["detect_s"] = 12.1
    assert not detect_line(SCENARIOS["nan_loss"], facts).passed
    facts.alert.update(detect_s=1.0, first_step=104)
    assert not detect_line(SCENARIOS["nan_loss"], facts).passed  # 4 steps late
    facts.brake = {"kind": "checkpoint_and_pause", "status": "succeeded", "brake_s": 3.0}
    assert (
        "the detection's 12.0 s + 15 s to brake"
        in brake_line(SCENARIOS["nan_loss"], facts).expectation
    )


def test_a_brake_whose_save_fails_holds_without_releasing_and_says_it_saved_nothing():
    scenario = SCENARIOS["checkpoint_disk_full"]
    periodic = {
        "path": "/c/10.pt",
        "sha256": "ab",
        "step": 10,
        "weights_step": 10,
        "reason": "manual",
        "brake_saved": False,
    }
    facts = Facts(fault_step=21, checkpoint=periodic, loads={"loads": True, "step": 10, "loss": 1})
    facts.brake = {"kind": "checkpoint_and_pause", "status": "failed", "error": "ENOSPC (drill)"}
    facts.release = {"job_status": "paused", "alive": True, "release_hook": False}
    facts.timeline = [
        "first_anomalous_point",
        "alert_raised",
        "command_issued",
        "notification_sent",
        "command_acknowledged",
    ]
    saved, loads, before = checkpoint_lines(scenario, facts)
    assert saved.passed and "the brake saved none (ENOSPC (drill))" in saved.measured
    assert loads.passed and before.passed
    assert release_line(scenario, facts).passed and timeline_line(scenario, facts).passed
    facts.release["release_hook"] = True  # released with nothing saved: the state is lost
    assert not release_line(scenario, facts).passed
    facts.brake["status"] = "succeeded"
    assert not checkpoint_lines(scenario, facts)[0].passed


def test_a_stopped_release_waits_longer_by_the_deafness_forgiven_after_the_alert():
    """The acknowledgement deadline a hung job's stop waits for moves like any deadline."""
    scenario = SCENARIOS["hang"]
    facts = Facts(fault_step=100, heartbeat_timeout_s=12.5, stop_after_s=20.0)
    facts.alert = {"rule_key": "heartbeat-timeout", "severity": "L3", "detect_s": 13.0}
    facts.brake = {"kind": "checkpoint_and_pause", "status": "timed_out", "brake_s": 0.0}
    quiet = 12.5 + M + scenario.brake_seconds + 20.0
    facts.brake["brake_s"] = quiet + 2.0
    assert not brake_line(scenario, facts).passed
    facts.forgiven_to_stop_s = 2.5
    line = brake_line(scenario, facts)
    assert line.passed
    assert line.expectation.endswith("+ 2.5 s the console forgave")
