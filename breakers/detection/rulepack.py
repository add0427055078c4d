"""The default breaker rule pack, as data, and per-team overrides — pure Python, no Django.

The pack follows docs/design.md "Severity levels" and "Metric layers". Metric-name conventions it
assumes (the SDK's names): `loss`, `grad_norm`, `lr`; `node.failure` or `node.<id>.failure`
(value > 0: that node failed); `gpu.<i>.xid` and `hardware.error` (value > 0: an error was
reported); `comm.failures` (count of failed collective operations); performance metrics
`throughput`, `gpu.<i>.util`, `dataloader.*` and anything under `perf.*`.

No heartbeat rule: heartbeats are not metric points, so a silence rule on them would never be
fed. The heartbeat timeout (L3, docs/design.md) is the control plane's watchdog on
`Job.heartbeat_deadline`.
The `silence` detector stays available for team rules on metrics that do stream.

Defaults are chosen so that a realistic noisy, decaying loss (a few % noise, occasional
one-point spikes) raises no more than a rare L1 over 100,000 steps (see
tests/breakers/test_rulepack_scenarios.py), while a real divergence walks L1 → L2 → L3.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from typing import Any

from breakers.detection.engine import RuleSpec
from breakers.monitoring.dcgm import agent_rules

PACK_VERSION = "2026.1"

_LOSS_WINDOW = 200  # points: long enough for a stable σ, short enough to follow the decay

DEFAULT_RULES: tuple[dict[str, Any], ...] = (
    {
        # L1: > 2σ from the sliding window. A single point beyond 2σ is ~5 % of healthy noise,
        # so the notice needs 3 consecutive points (white noise: ~2e-5 per point).
        "key": "loss-deviation",
        "name": "Loss deviates from its sliding window",
        "layer": "stability",
        "metric": "loss",
        "detector": "deviation",
        "params": {"k": 2.0, "window": _LOSS_WINDOW, "sustain_points": 4},
        "severity": "L1",
        "action": "none",
        "clear_after": 20,
        "runbook": "loss-divergence",
    },
    {
        # L2: > 4σ above the baseline for 10 minutes. The baseline freezes while the loss
        # deviates (else a divergence would be absorbed before 10 minutes) and is re-learned
        # after an hour, so a benign permanent level change eventually clears.
        "key": "loss-sustained-deviation",
        "name": "Loss above 4σ for 10 minutes",
        "layer": "stability",
        "metric": "loss",
        "detector": "sustained",
        "params": {
            "k": 4.0,
            "window": 500,
            "direction": "above",
            "sustain_seconds": 600.0,
            "grace_points": 3,
            "max_freeze_seconds": 3600.0,
        },
        "severity": "L2",
        "action": "lower_lr",
        "action_params": {"factor": 0.5},
        "clear_after": 30,
        "runbook": "loss-divergence",
    },
    {
        # The same condition with the other soft mitigation; enable it (and usually disable
        # the lower_lr rule) per team: {"loss-sustained-pause-data": {"enabled": True}}.
        "key": "loss-sustained-pause-data",
        "name": "Loss above 4σ for 10 minutes (pause data loading)",
        "layer": "stability",
        "metric": "loss",
        "detector": "sustained",
        "params": {
            "k": 4.0,
            "window": 500,
            "direction": "above",
            "sustain_seconds": 600.0,
            "grace_points": 3,
            "max_freeze_seconds": 3600.0,
        },
        "severity": "L2",
        "action": "pause_data",
        "enabled": False,
        "clear_after": 30,
        "runbook": "loss-divergence",
    },
    {
        "key": "non-finite-loss-or-gradients",
        "name": "NaN/Inf in loss or gradients",
        "layer": "stability",
        "metric": "loss|grad_norm",
        "detector": "non_finite",
        "params": {},
        # Per node: a non-finite loss is the poisoned rank's own, so its node is information.
        "per_node": True,
        "severity": "L3",
        "action": "checkpoint_and_pause",
        "clear_after": 10,
        "runbook": "nan-inf",
    },
    {
        # The SDK's step guard refused an update computed from NaN/Inf (a gradient the loss
        # does not show, or run.guard(loss)) and holds at that boundary for this rule's answer.
        # One alert per job, not per node: in data-parallel training a refusal is job-wide by
        # nature (the all-reduce hands every rank the same poisoned gradients, so every rank
        # refuses), and which nodes refused says nothing about where the NaN came from. The
        # rule above, per node, says where the loss itself went non-finite.
        "key": "update-refused-by-guard",
        "name": "Non-finite update refused by the step guard",
        "layer": "stability",
        "metric": "guard.skipped_updates",
        "detector": "threshold",
        "params": {"above": 0.0},
        "per_node": False,
        "severity": "L3",
        "action": "checkpoint_and_pause",
        "clear_after": 10,
        "runbook": "nan-inf",
    },
    {
        # K = 5 rising 50-step windows, each rise > 2 standard errors of the difference
        # (0.4σ of the per-step noise): over 100k simulated plateau windows no run got past
        # 2 rises, while a loss climbing ≥ 0.02σ per step trips it within 300 steps.
        "key": "loss-rising",
        "name": "Loss rising over consecutive windows",
        "layer": "stability",
        "metric": "loss",
        "detector": "rising",
        "params": {"window": 50, "windows": 5, "min_rise_se": 2.0},
        "severity": "L3",
        "action": "checkpoint_and_pause",
        "clear_after": 2,
        "runbook": "loss-divergence",
    },
    {
        "key": "nodes-failing",
        "name": "Several nodes failing",
        "layer": "health",
        "metric": "node.failure|node.*.failure",
        "detector": "node_failures",
        "params": {"min_nodes": 2, "window_seconds": 60.0},
        "per_metric": False,
        "severity": "L4",
        "action": "terminate_and_isolate",
        "runbook": "node-failure",
    },
    {
        "key": "hardware-error",
        "name": "Hardware error (GPU XID)",
        "layer": "health",
        "metric": "gpu.*.xid|hardware.error",
        "detector": "threshold",
        "params": {"above": 0.0},
        "per_node": True,
        "severity": "L4",
        "action": "terminate_and_isolate",
        "runbook": "hardware-error",
    },
    {
        "key": "communication-failure",
        "name": "Multi-node communication failure",
        "layer": "health",
        "metric": "comm.failures",
        "detector": "threshold",
        "params": {"above": 0.0},
        "per_node": True,
        "severity": "L4",
        "action": "terminate_and_isolate",
        "runbook": "hung-job",
    },
    {
        # Performance: record only (daily digest). A sustained drop freezes the baseline
        # like the L2 loss rule, else 30 absorbed points would already hide a step change.
        "key": "throughput-drop",
        "name": "Throughput dropped",
        "layer": "performance",
        "metric": "throughput|dataloader.*|perf.*",
        "detector": "sustained",
        "params": {
            "k": 3.0,
            "window": 300,
            "direction": "below",
            "sustain_points": 30,
            "grace_points": 2,
            "max_freeze_seconds": 3600.0,
        },
        "severity": "L1",
        "action": "record",
        "clear_after": 30,
    },
    {
        "key": "accelerator-underused",
        "name": "Accelerator utilisation dropped",
        "layer": "performance",
        "metric": "gpu.*.util",
        "detector": "sustained",
        "params": {
            "k": 3.0,
            "window": 300,
            "direction": "below",
            "sustain_points": 60,
            "grace_points": 2,
            "max_freeze_seconds": 3600.0,
        },
        "per_node": True,
        "severity": "L1",
        "action": "record",
        "clear_after": 60,
    },
    # NVIDIA DCGM's field names, pushed as they are (breakers.monitoring.dcgm, docs/monitoring.md).
    *agent_rules(),
)


def default_rules() -> list[RuleSpec]:
    """The default pack as RuleSpecs (fresh objects each call)."""
    return [RuleSpec.from_dict(spec) for spec in DEFAULT_RULES]


_MERGED_FIELDS = ("params", "action_params")


def apply_overrides(
    rules: Iterable[RuleSpec], overrides: Mapping[str, Mapping[str, Any] | bool | None]
) -> list[RuleSpec]:
    """A team's rule set: `rules` with `overrides` applied (inputs unchanged).

    `overrides` maps a rule key to
    * False or None — the rule is disabled (kept in the list, `enabled=False`);
    * True — the rule is enabled;
    * a dict of changed fields. `params` and `action_params` are merged key by key into the
      rule's (a None value removes that key, i.e. back to the detector default) — except
      `params` when `detector` changes kind: then they replace. Any other field is replaced;
      `key` cannot change.
    A key that is not in `rules` adds a team rule; its dict must then be a complete rule.
    Every resulting rule is validated again (ValueError on an invalid change).
    """
    result = list(rules)
    index = {rule.key: position for position, rule in enumerate(result)}
    for key, change in overrides.items():
        if key not in index:
            if not isinstance(change, Mapping):
                raise ValueError(f"no rule {key!r} to enable or disable")
            result.append(RuleSpec.from_dict({"key": key, **change}))
            continue
        position = index[key]
        result[position] = _override_one(result[position], change)
    return result


def _override_one(rule: RuleSpec, change: Mapping[str, Any] | bool | None) -> RuleSpec:
    if change is None or isinstance(change, bool):
        return replace(rule, enabled=bool(change))
    allowed = {f.name for f in fields(RuleSpec) if f.init} - {"key"}
    unknown = set(change) - allowed
    if unknown:
        raise ValueError(f"{rule.key}: cannot override {', '.join(sorted(unknown))}")
    updates = dict(change)
    new_kind = updates.get("detector", rule.detector) != rule.detector
    for name in _MERGED_FIELDS:
        if name in updates and not (name == "params" and new_kind):
            merged = {**getattr(rule, name), **updates[name]}
            updates[name] = {k: v for k, v in merged.items() if v is not None}
    return replace(rule, **updates)


def ruleset_fingerprint(rules: Iterable[RuleSpec]) -> str:
    """A stable hash of a rule set (order-independent), e.g. to flag a rule set changed since
    its last passing drill."""
    canonical = sorted(json.dumps(rule.to_dict(), sort_keys=True) for rule in rules)
    return hashlib.sha256("\n".join(canonical).encode()).hexdigest()
