"""The verdict with history, table by table: recover, stop and page, isolate and page, or hold.
The pure core (breakers.recovery.verdict): no Django, no database."""

from __future__ import annotations

from dataclasses import replace

import pytest

from breakers.detection.engine import RuleSpec
from breakers.detection.rulepack import DEFAULT_RULES
from breakers.detection.ruleset_core import ChangeError, apply_changes, parse_changes
from breakers.recovery.attribution import Rerun, reported, weighed
from breakers.recovery.verdict import (
    EarlierRecovery,
    Evidence,
    Verdict,
    decide,
    skip_steps,
    suspect,
)

NAN = "non-finite-loss-or-gradients"
BASE = Evidence(
    rule_key=NAN,
    cause="nan-inf",
    policy="recover",
    budget=3,
    first_step=30,
    last_step=30,
    rank=0,
    node="gpu-a",
    clean_checkpoint_step=30,
)


def earlier(first: int, last: int, cause: str = "nan-inf") -> EarlierRecovery:
    return EarlierRecovery(cause, first, last)


DATA = Rerun(30, "data", 0, "gpu-a")  # the step re-run on the same batch: NaN again
TRANSIENT = Rerun(30, "transient", 0, "gpu-a")  # ... and finite: the node


VERDICTS = [
    # (why, changes to the evidence, verdict, a phrase one of the reasons holds)
    ("first time, clean checkpoint", {}, Verdict.RECOVER, "first time for this cause"),
    ("policy says hold", {"policy": "hold"}, Verdict.HOLD, "policy is hold for a person"),
    ("a drill sandbox", {"drill": True}, Verdict.HOLD, "drill sandbox"),
    (
        "a drill of the recovery path goes on as a real job",
        {"drill": True, "drill_of_recovery": True},
        Verdict.RECOVER,
        "a drill of the recovery path: it acts on its own sandbox job only",
    ),
    (
        "a drill of the recovery path still stops on a repeat",
        {"drill": True, "drill_of_recovery": True, "earlier": (earlier(30, 30),)},
        Verdict.STOP_AND_PAGE,
        "same step window",
    ),
    (
        "a drill of the recovery path a person took over holds",
        {"drill": True, "drill_of_recovery": True, "taken_over_by": "ana took over"},
        Verdict.HOLD,
        "ana took over",
    ),
    (
        "the operator's progress threshold",
        {"first_step": 36, "last_step": 36, "earlier": (earlier(30, 30),), "min_progress_steps": 6},
        Verdict.STOP_AND_PAGE,
        "only 5 healthy step(s) since, fewer than 6",
    ),
    (
        "the operator's skip threshold",
        {"first_step": 20, "last_step": 30, "clean_checkpoint_step": 19, "max_skip_steps": 10},
        Verdict.STOP_AND_PAGE,
        "11 steps to skip, more than 10",
    ),
    (
        "a person took over",
        {"taken_over_by": "ana took over this incident"},
        Verdict.HOLD,
        "ana took over",
    ),
    (
        "hardware signal on the node",
        {"hardware_signals": ("dcgm-xid on gpu-a (L2, firing)",)},
        Verdict.ISOLATE_AND_PAGE,
        "hardware signal on the node: dcgm-xid",
    ),
    (
        "hardware beats a repeat: the node is what to take out",
        {"hardware_signals": ("hardware-error on gpu-a",), "earlier": (earlier(30, 30),)},
        Verdict.ISOLATE_AND_PAGE,
        "hardware",
    ),
    (
        "hold beats hardware: the policy is the team's word",
        {"policy": "hold", "hardware_signals": ("hardware-error on gpu-a",)},
        Verdict.HOLD,
        "policy",
    ),
    (
        "the same step window again",
        {"earlier": (earlier(28, 31, "other-rule"),)},
        Verdict.STOP_AND_PAGE,
        "same step window (28–31)",
    ),
    (
        "same cause, the very next window: no progress",
        {"first_step": 31, "last_step": 31, "earlier": (earlier(30, 30),)},
        Verdict.STOP_AND_PAGE,
        "only 0 healthy step(s) since",
    ),
    (
        "same cause, a few steps later: still no progress",
        {"first_step": 39, "last_step": 39, "earlier": (earlier(30, 30),)},
        Verdict.STOP_AND_PAGE,
        "only 8 healthy step(s) since, fewer than 10",
    ),
    (
        "same cause after enough progress",
        {"first_step": 41, "last_step": 41, "earlier": (earlier(30, 30),)},
        Verdict.RECOVER,
        "made progress since",
    ),
    (
        "another rule of the same cause right after: the same cause",
        {
            "rule_key": "update-refused-by-guard",
            "first_step": 31,
            "last_step": 31,
            "earlier": (earlier(30, 30),),
        },
        Verdict.STOP_AND_PAGE,
        "same cause (nan-inf)",
    ),
    (
        "another cause right after: not the same cause",
        {
            "cause": "loss-divergence",
            "first_step": 31,
            "last_step": 31,
            "earlier": (earlier(30, 30),),
        },
        Verdict.RECOVER,
        "first time for this cause",
    ),
    (
        "budget spent",
        {"recoveries_last_hour": 3, "earlier": (earlier(5, 5, "a"), earlier(9, 9, "b"))},
        Verdict.STOP_AND_PAGE,
        "budget spent: 3 automatic recoveries in the last hour (at most 3)",
    ),
    ("budget not spent", {"recoveries_last_hour": 2}, Verdict.RECOVER, "recovery 3 of at most 3"),
    (
        "no clean checkpoint",
        {"clean_checkpoint_step": None},
        Verdict.STOP_AND_PAGE,
        "no clean checkpoint",
    ),
    (
        "a window too wide to be a batch",
        {"first_step": 100, "last_step": 400, "clean_checkpoint_step": 90},
        Verdict.STOP_AND_PAGE,
        "301 steps to skip, more than 100",
    ),
    # Re-run to attribute: the step re-run on the same batch from the same state.
    (
        "the re-run was finite: a transient fault, the node",
        {"rerun": TRANSIENT},
        Verdict.ISOLATE_AND_PAGE,
        "transient fault of the node gpu-a, not the data",
    ),
    (
        "the re-run's node is named even where the alert names none",
        {"rerun": TRANSIENT, "node": ""},
        Verdict.ISOLATE_AND_PAGE,
        "node gpu-a",
    ),
    (
        "a transient fault beats a repeat: the node is what to take out",
        {
            "rerun": replace(TRANSIENT, step=31),
            "first_step": 31,
            "last_step": 31,
            "earlier": (earlier(30, 30),),
        },
        Verdict.ISOLATE_AND_PAGE,
        "transient fault",
    ),
    (
        "hardware signal and a transient re-run: the hardware signal first",
        {"rerun": TRANSIENT, "hardware_signals": ("dcgm-xid on gpu-a (L2, firing)",)},
        Verdict.ISOLATE_AND_PAGE,
        "hardware signal on the node: dcgm-xid",
    ),
    (
        "hold beats a transient re-run: the policy is the team's word",
        {"rerun": TRANSIENT, "policy": "hold"},
        Verdict.HOLD,
        "policy",
    ),
    (
        "the re-run repeated: the data, recovered past its batch",
        {"rerun": DATA},
        Verdict.RECOVER,
        "the data (or the model), not the node; batch flagged",
    ),
    (
        "the repeating batch is behind the brake's checkpoint",
        {"rerun": DATA},
        Verdict.RECOVER,
        "the batch of step 30 is behind the checkpoint's data position",
    ),
    (
        "the repeating batch after an earlier checkpoint is skipped",
        {"rerun": DATA, "clean_checkpoint_step": 28},
        Verdict.RECOVER,
        "the batch of step 30 is skipped",
    ),
    (
        "data moves no row: the budget still stops",
        {"rerun": DATA, "recoveries_last_hour": 3},
        Verdict.STOP_AND_PAGE,
        "budget spent",
    ),
    (
        "data moves no row: the same cause without progress still stops",
        {
            "rerun": replace(DATA, step=31),
            "first_step": 31,
            "last_step": 31,
            "earlier": (earlier(30, 30),),
        },
        Verdict.STOP_AND_PAGE,
        "no progress",
    ),
]


@pytest.mark.parametrize(
    ("why", "changes", "verdict", "phrase"), VERDICTS, ids=[v[0] for v in VERDICTS]
)
def test_the_verdict_table(why, changes, verdict, phrase):
    decision = decide(replace(BASE, **changes))
    assert decision.verdict == verdict, decision.reasons
    assert any(phrase in reason for reason in decision.reasons), decision.reasons
    # The first reason always says which rule, where: the incident reads it first.
    assert decision.reasons[0].startswith(f"rule {changes.get('rule_key', NAN)} at step")


def test_the_first_reason_names_the_window_rank_and_node():
    decision = decide(replace(BASE, first_step=30, last_step=32))
    assert decision.reasons[0] == f"rule {NAN} at steps 30–32, rank 0 on gpu-a"
    assert decide(replace(BASE, rank=None, node="")).reasons[0] == f"rule {NAN} at step 30"


@pytest.mark.parametrize(
    ("first", "last", "checkpoint", "skipped"),
    [
        (30, 30, 30, []),  # the guard's brake checkpoint: the batch is behind it already
        (30, 30, 28, [30]),
        (30, 32, 28, [30, 31, 32]),
        (30, 32, 31, [32]),
        (30, 32, 35, []),
    ],
)
def test_skip_steps_are_the_window_after_the_checkpoint(first, last, checkpoint, skipped):
    assert skip_steps(first, last, checkpoint) == skipped


def test_the_data_reason_stands_with_a_stop_too():
    decision = decide(replace(BASE, rerun=DATA, clean_checkpoint_step=None))
    assert decision.verdict == Verdict.STOP_AND_PAGE
    assert any("not the node" in reason for reason in decision.reasons)


def test_the_suspect_is_the_node_whose_step_did_not_repeat():
    other = Rerun(30, "transient", 2, "gpu-c")
    assert suspect(replace(BASE, rerun=other)) == (2, "gpu-c")
    assert suspect(replace(BASE, rerun=replace(other, attribution="data"))) == (0, "gpu-a")
    assert suspect(replace(BASE, rerun=Rerun(30, "transient"))) == (0, "gpu-a")
    assert suspect(BASE) == (0, "gpu-a")


def test_the_findings_of_an_acknowledgement_are_read_by_rank():
    single = {"step": 30, "rerun": {"step": 30, "attribution": "data"}}
    assert reported(single) == [Rerun(30, "data")]
    assert reported({"step": 30}) == []
    merged = {  # a multi-rank job's result: rank 0's own, and every rank's summary
        "rank": 0,
        "rerun": {"step": 30, "attribution": "data"},
        "ranks": {
            "0": {"status": "succeeded", "rerun": {"step": 30, "attribution": "data"}},
            "1": {"status": "succeeded"},
            "2": {"status": "succeeded", "rerun": {"step": 30, "attribution": "transient"}},
        },
    }
    assert reported(merged) == [Rerun(30, "data", 0), Rerun(30, "transient", 2)]


@pytest.mark.parametrize(
    ("reruns", "weighs"),
    [
        ([], None),
        ([Rerun(12, "transient")], None),  # another trip's, outside the window
        ([Rerun(30, "data", 0)], Rerun(30, "data", 0)),
        ([Rerun(30, "data", 0), Rerun(31, "transient", 1)], Rerun(31, "transient", 1)),
        ([Rerun(30, "data", 0), Rerun(33, "transient", 1)], Rerun(30, "data", 0)),
    ],
)
def test_the_finding_weighed_is_a_transient_one_in_the_window_else_the_data(reruns, weighs):
    assert weighed(reruns, 30, 32) == weighs


# --- The policy as a rule's fields -------------------------------------------------------

RULES = {r["key"]: RuleSpec.from_dict(r).to_dict() for r in DEFAULT_RULES}


def test_a_rule_holds_for_a_person_by_default():
    assert RULES[NAN]["recovery"] == "hold" and RULES[NAN]["recovery_budget"] == 3


def test_an_l3_brake_rule_may_recover_automatically():
    changes = parse_changes(
        [{"op": "update", "key": NAN, "fields": {"recovery": "recover", "recovery_budget": 5}}]
    )
    rows = apply_changes({}, RULES, changes)
    assert rows[NAN]["recovery"] == "recover" and rows[NAN]["recovery_budget"] == 5


@pytest.mark.parametrize(
    ("key", "fields", "field"),
    [
        (NAN, {"recovery": "always"}, "changes[0].fields.recovery"),
        (NAN, {"recovery_budget": 0}, "changes[0].fields.recovery_budget"),
        (NAN, {"recovery_budget": 101}, "changes[0].fields.recovery_budget"),
        (NAN, {"recovery_budget": True}, "changes[0].fields.recovery_budget"),
        (NAN, {"recovery_budget": 2.5}, "changes[0].fields.recovery_budget"),
        # Only an automatic L3 pause is recovered: never an L4, never a soft mitigation.
        ("hardware-error", {"recovery": "recover"}, "changes[0].fields.recovery"),
        ("loss-deviation", {"recovery": "recover"}, "changes[0].fields.recovery"),
        (NAN, {"recovery": "recover", "severity": "L4"}, "changes[0].fields.recovery"),
    ],
)
def test_a_policy_that_cannot_be_is_refused_naming_its_field(key, fields, field):
    with pytest.raises(ChangeError) as refused:
        apply_changes({}, RULES, parse_changes([{"op": "update", "key": key, "fields": fields}]))
    assert refused.value.field == field
