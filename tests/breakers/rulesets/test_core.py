"""The pure core of versioned rule sets: parsing changes (hostile inputs name their field),
applying them, snapshots and diffs, drilled or not, the schedule's period. No Django."""

from __future__ import annotations

import math

import pytest

from breakers.detection import ruleset_core as core
from breakers.detection.engine import RuleSpec
from breakers.detection.rulepack import DEFAULT_RULES

DEFAULTS = {r["key"]: RuleSpec.from_dict(r).to_dict() for r in DEFAULT_RULES}
NEW_RULE = {
    "name": "Grad norm spike",
    "layer": "stability",
    "metric": "grad_norm",
    "detector": "threshold",
    "params": {"above": 100.0},
    "severity": "L2",
    "action": "lower_lr",
    "action_params": {"factor": 0.5},
}


def one(op="update", key="loss-deviation", fields=None):
    return {"op": op, "key": key, **({"fields": fields} if fields is not None else {})}


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (None, "changes"),
        ([], "changes"),
        ({"op": "update"}, "changes"),
        ([one()] * 101, "changes"),
        (["update"], "changes[0]"),
        ([{**one(), "extra": 1}], "changes[0]"),
        ([one(op="drop")], "changes[0].op"),
        ([one(key="")], "changes[0].key"),
        ([one(key="Loss Deviation")], "changes[0].key"),
        ([one(key="x" * 101)], "changes[0].key"),
        ([one(key=7)], "changes[0].key"),
        ([one(), one()], "changes[1].key"),
        ([one(fields=[1])], "changes[0].fields"),
        ([one(op="disable", fields={"enabled": True})], "changes[0].fields"),
        ([one(fields={"key": "other"})], "changes[0].fields.key"),
        ([one(fields={"colour": "red"})], "changes[0].fields.colour"),
        ([one(fields={"severity": "L5"})], "changes[0].fields.severity"),
        ([one(fields={"layer": "mood"})], "changes[0].fields.layer"),
        ([one(fields={"detector": "crystal_ball"})], "changes[0].fields.detector"),
        ([one(fields={"action": "rm -rf"})], "changes[0].fields.action"),
        ([one(fields={"name": ""})], "changes[0].fields.name"),
        ([one(fields={"name": "a\x00b"})], "changes[0].fields.name"),
        ([one(fields={"metric": "m" * 301})], "changes[0].fields.metric"),
        ([one(fields={"metric": ["loss"]})], "changes[0].fields.metric"),
        ([one(fields={"enabled": "yes"})], "changes[0].fields.enabled"),
        ([one(fields={"clear_after": True})], "changes[0].fields.clear_after"),
        ([one(fields={"clear_after": 0})], "changes[0].fields.clear_after"),
        ([one(fields={"clear_after": 10**12})], "changes[0].fields.clear_after"),
        ([one(fields={"clear_after_seconds": math.nan})], "changes[0].fields.clear_after_seconds"),
        ([one(fields={"clear_after_seconds": -1})], "changes[0].fields.clear_after_seconds"),
        ([one(fields={"params": "k=2"})], "changes[0].fields.params"),
        ([one(fields={"params": {"k": math.inf}})], "changes[0].fields.params.k"),
        (
            [one(fields={"params": {"k": {"a": {"b": {"c": {}}}}}})],
            "changes[0].fields.params.k.a.b.c",
        ),
        ([one(fields={"action_params": {"f\x00": 1}})], "changes[0].fields.action_params"),
        ([one(fields={"params": {"k": object()}})], "changes[0].fields.params.k"),
    ],
)
def test_hostile_changes_are_refused_naming_the_field(raw, field):
    with pytest.raises(core.ChangeError) as refused:
        core.parse_changes(raw)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (one(fields={"params": {"k": 0}}), "changes[0].fields.params"),
        (one(fields={"params": {"window": 200, "sigma": 2}}), "changes[0].fields.params"),
        (one(fields={"detector": "threshold"}), "changes[0].fields.params"),  # k, window unknown
        (one(key="no-such-rule", fields={"name": "x"}), "changes[0].key"),
        (one(op="create", key="loss-deviation", fields=NEW_RULE), "changes[0].key"),
        (one(op="create", key="new-rule", fields={"name": "x"}), "changes[0].fields.layer"),
        (one(op="delete"), "changes[0].key"),  # a default rule: disable it instead
        (
            one(
                op="create",
                key="perf",
                fields={**NEW_RULE, "layer": "performance", "action": "lower_lr"},
            ),
            "changes[0].fields.action",
        ),
    ],
)
def test_changes_that_do_not_fit_the_rule_set_name_the_field(change, field):
    with pytest.raises(core.ChangeError) as refused:
        core.apply_changes({}, DEFAULTS, core.parse_changes([change]))
    assert refused.value.field == field


def test_applying_changes_overrides_creates_switches_and_deletes():
    parsed = core.parse_changes(
        [
            one(fields={"params": {"k": 3.0, "window": 200, "sustain_points": 4}}),
            one(op="disable", key="loss-rising"),
            one(op="create", key="grad-spike", fields=NEW_RULE),
        ]
    )
    rows = core.apply_changes({}, DEFAULTS, parsed)
    assert set(rows) == {"loss-deviation", "loss-rising", "grad-spike"}
    assert rows["loss-deviation"]["params"] == {"k": 3.0, "window": 200, "sustain_points": 4}
    assert rows["loss-deviation"]["name"] == DEFAULTS["loss-deviation"]["name"]  # a copy
    assert rows["loss-rising"]["enabled"] is False
    assert rows["grad-spike"]["clear_after"] == 1  # RuleSpec's default filled in
    back = core.apply_changes(rows, DEFAULTS, core.parse_changes([one(op="delete")]))
    assert "loss-deviation" not in back and "grad-spike" in back
    assert "loss-deviation" in rows  # inputs unchanged


def _snap(rules, braking=None):
    return core.snapshot(
        [{**r, "origin": "default"} for r in rules], braking or {"executor_grace_seconds": 10.0}
    )


def test_the_diff_names_each_rule_and_field_that_moved():
    old = _snap(DEFAULTS.values())
    changed = dict(DEFAULTS)
    changed["loss-deviation"] = {
        **DEFAULTS["loss-deviation"],
        "params": {"k": 3.0, "window": 200, "sustain_points": 4},
        "severity": "L2",
    }
    changed["grad-spike"] = RuleSpec.from_dict({"key": "grad-spike", **NEW_RULE}).to_dict()
    del changed["loss-rising"]
    new = _snap(changed.values(), {"executor_grace_seconds": 30.0})
    entries = core.diff(old, new)
    assert core.describe(entries) == [
        "grad-spike: added",
        "loss-deviation: params.k 2.0 → 3.0; severity L1 → L2",
        "loss-rising: removed",
        "setting executor_grace_seconds: 10.0 → 30.0",
    ]
    assert core.summary(entries) == (
        "grad-spike, loss-deviation, loss-rising, setting executor_grace_seconds changed"
    )
    assert core.diff(old, old) == [] and core.summary([]) == "no change"
    first = core.diff(None, old)
    assert core.summary(first) == f"first recorded version ({len(DEFAULTS)} rules)"


def test_the_fingerprint_is_canonical():
    a = _snap(DEFAULTS.values())
    b = _snap(reversed(list(DEFAULTS.values())))
    assert core.fingerprint(a) == core.fingerprint(b)
    assert core.canonical_json(a) == core.canonical_json(b)
    assert core.fingerprint(a) != core.fingerprint(_snap(list(DEFAULTS.values())[1:]))


def test_params_added_or_dropped_show_in_the_diff():
    rule = {**DEFAULTS["loss-rising"], "origin": "team"}
    old = core.snapshot([rule], {})
    new = core.snapshot([{**rule, "params": {"window": 50}, "origin": "override"}], {})
    assert core.describe(core.diff(old, new)) == [
        "loss-rising: origin team → override; params.min_rise_se 2.0 → –; params.windows 5 → –"
    ]


COVERAGE = {
    "nan_loss": ("non-finite-loss-or-gradients",),
    "hang": ("heartbeat",),
    "xid": ("hardware-error", "nodes-failing"),
}


@pytest.mark.parametrize(
    ("active", "coverage", "passing", "drilled", "missing", "uncovered"),
    [
        # every covering scenario passed: drilled (a scenario covering nothing active is moot)
        (
            ["non-finite-loss-or-gradients", "hardware-error"],
            COVERAGE,
            {"nan_loss", "xid"},
            True,
            [],
            [],
        ),
        # one covering scenario has no passing drill on this version
        (
            ["non-finite-loss-or-gradients", "hardware-error"],
            COVERAGE,
            {"nan_loss"},
            False,
            ["xid"],
            [],
        ),
        # nothing passed on this version (a rule just changed)
        (["non-finite-loss-or-gradients"], COVERAGE, set(), False, ["nan_loss"], []),
        # a team rule no scenario covers is reported, and does not block "drilled"
        (
            ["non-finite-loss-or-gradients", "grad-spike"],
            COVERAGE,
            {"nan_loss"},
            True,
            [],
            ["grad-spike"],
        ),
        # no scenario covers any active rule: nothing vouches for it
        (["grad-spike"], COVERAGE, {"nan_loss", "xid", "hang"}, False, [], ["grad-spike"]),
        # no coverage at all (the drills are not there): never drilled
        (["non-finite-loss-or-gradients"], {}, set(), False, [], ["non-finite-loss-or-gradients"]),
        # a disabled rule's scenario is not required
        (["hardware-error"], COVERAGE, {"xid"}, True, [], []),
    ],
)
def test_drill_status(active, coverage, passing, drilled, missing, uncovered):
    assert core.drill_status(active, coverage, passing) == core.DrillStatus(
        drilled, missing, uncovered
    )


def test_the_schedule_period_is_stable_within_a_period_and_moves_after_it():
    month = 30 * 86400.0
    assert core.schedule_period(0, month) == core.schedule_period(month - 1, month) == 0
    assert core.schedule_period(month, month) == 1


@pytest.mark.parametrize(
    ("field", "changed"), [("recovery", "recover"), ("recovery_budget", 5), ("shadow", True)]
)
def test_fields_a_rule_set_never_used_leave_its_fingerprint_as_it_was(field, changed):
    """A console upgraded to a version with a new rule field records no spurious "changed
    outside the console" version: at its default the field is left out of the snapshot."""
    from breakers.detection.engine import RuleSpec

    spec = RuleSpec("r", "R", "stability", "loss", "non_finite", severity="L3")
    rule = spec.to_dict()
    before = {k: v for k, v in rule.items() if k not in core.OMITTED_AT_DEFAULT}
    assert core.fingerprint(core.snapshot([rule], {})) == core.fingerprint(
        core.snapshot([before], {})
    )
    assert core.fingerprint(core.snapshot([{**rule, field: changed}], {})) != core.fingerprint(
        core.snapshot([rule], {})
    )
