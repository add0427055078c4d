"""The scorecard's lines of a drill of the recovery path, table by table: each fails on the
one fact it judges (pure: no database)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from breakers.drills.scenarios import SCENARIOS
from breakers.drills.scorecard import Facts, score

SCENARIO = SCENARIOS["poisoned_batch"]
RECOVERY: dict[str, Any] = {
    "verdict": "recover",
    "status": "recovered",
    "reasons": ["rule non-finite-loss-or-gradients at step 25", "first time for this cause"],
    "decided_s": 0.8,
    "recorded_first": True,
    "recovery_job": 7,
    "resume_job": 7,
    "sandbox_job": 7,
    "checkpoint_id": 3,
    "checkpoint_step": 25,
    "weights_step": 24,
    "skip_steps": [],
    "finished_s": 1.0,
    "resume": {"status": "succeeded", "error": "", "rolled_back": True, "restored_step": 25}
    | {"sha256_matches": True},
    "resumed": {"job_status": "running", "steps": 12, "non_finite": 0, "fault_step_losses": 1},
}
NAMES = ["verdict recorded", "rolled back", "step skipped", "resumed", "time to recover"]


def lines(recovery: dict[str, Any] | None) -> dict[str, Any]:
    facts = Facts(fault_step=25, recovery=recovery)
    facts.alert = {"rule_key": "non-finite-loss-or-gradients", "severity": "L3", "detect_s": 0.1}
    facts.alert |= {"first_step": 25, "step": 25}
    facts.brake = {"kind": "checkpoint_and_pause", "status": "succeeded", "brake_s": 0.4}
    return {line.name: line for line in score(SCENARIO, facts) if line.name in NAMES}


def changed(path: str, value: Any) -> dict[str, Any]:
    recovery = copy.deepcopy(RECOVERY)
    *parents, key = path.split(".")
    target = recovery
    for parent in parents:
        target = target[parent]
    target[key] = value
    return recovery


def test_a_clean_recovery_passes_every_line():
    judged = lines(RECOVERY)
    assert list(judged) == NAMES
    assert all(line.passed for line in judged.values()), judged
    assert judged["step skipped"].measured == (
        "step 25: behind the restored state (step 25, without its update)"
    )
    assert judged["time to recover"].measured == "1.00 s (0.60 s after the brake)"


FAILURES = [
    ("verdict recorded", "verdict", "stop_and_page"),
    ("verdict recorded", "recorded_first", False),
    ("rolled back", "resume_job", 8),  # the roll back went to another job than the sandbox
    ("rolled back", "recovery_job", 8),
    ("rolled back", "weights_step", 25),  # a checkpoint holding the poisoned update
    ("rolled back", "resume.sha256_matches", False),
    ("rolled back", "resume.rolled_back", False),
    ("step skipped", "resume.restored_step", 24),  # the poisoned batch ahead, not skipped
    ("step skipped", "resumed.fault_step_losses", 2),  # trained on again
    ("resumed", "resumed.job_status", "paused"),
    ("resumed", "resumed.steps", 9),
    ("resumed", "resumed.non_finite", 1),
    ("time to recover", "finished_s", 86.0),  # the brake's 25 s + 60 s
    ("time to recover", "status", "failed"),
]


@pytest.mark.parametrize(("line", "path", "value"), FAILURES)
def test_each_line_fails_on_its_own_fact(line, path, value):
    judged = lines(changed(path, value))
    assert not judged[line].passed, judged[line]


def test_a_dropped_batch_counts_as_skipped():
    recovery = changed("skip_steps", [25])
    recovery["resume"]["restored_step"] = recovery["checkpoint_step"] = 20
    recovery["weights_step"] = 20
    assert lines(recovery)["step skipped"].passed


def test_no_verdict_fails_every_recovery_line():
    judged = lines(None)
    assert list(judged) == NAMES and not any(line.passed for line in judged.values())
