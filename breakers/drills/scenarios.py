"""The drill scenarios: which fault, what must happen, which rules it rehearses. Pure data.

``rules`` are keys of the default pack (``breakers.detection.rulepack``, plus the watchdog's
``heartbeat-timeout``): a scenario *covers* a rule when the rule is one that must fire for it,
so "which scenarios cover rule R" (:func:`covering`) says what to drill again after R changed.
``release`` says what the process must look like once braked: ``holds`` (paused, alive,
heartbeating), ``exits`` (terminated by the SDK with EXIT_TERMINATED), ``stopped`` (hung,
stopped from outside by the job's executor, which the timeline must show) or ``recovers``
(the drill of the recovery path: braked, then rolled back, the poisoned batch skipped and
training resumed by the console's automatic recovery, on the drill's own sandbox only).
``poisons_weights``: the fault corrupts the update of its step, so the checkpoint must hold no
update from that step on; otherwise the step itself is sound and may be in the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

HEARTBEAT_RULE = "heartbeat-timeout"  # incidents.heartbeats.HEARTBEAT_RULE_KEY, the watchdog's
RECOVERS = "recovers"  # the release of a drill of the recovery path


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str  # the SDK's fault (sdk/brakeline/_drill.py FAULTS)
    level: str  # the level the breaker must fire at
    rules: tuple[str, ...]  # the rule keys that may answer it (the first firing one counts)
    release: str  # holds / exits / stopped
    poisons_weights: bool
    # False: the brake's own save is meant to fail (the job still holds, without a new
    # checkpoint and without releasing its accelerators).
    brake_saves: bool = True
    # From the alert to the brake taking effect (the acknowledgement, or the executor's stop
    # after its deadline): the detection's budget comes from the answering rule itself
    # (scorecard.detect_budget). Sized for a loaded two-core CI machine (docs/drills.md).
    brake_seconds: float = 15.0
    params: dict[str, Any] = field(default_factory=dict)
    summary: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fault": self.fault,
            "level": self.level,
            "rules": list(self.rules),
            "release": self.release,
            "summary": self.summary,
        }


_NONFINITE = ("non-finite-loss-or-gradients", "update-refused-by-guard")

SCENARIOS: MappingProxyType[str, Scenario] = MappingProxyType(
    {
        s.name: s
        for s in (
            Scenario(
                "nan_loss",
                "nan_loss",
                "L3",
                _NONFINITE,
                "holds",
                True,
                summary="NaN in the loss: the guard skips the update, the L3 rule checkpoints "
                "and pauses; the process holds.",
            ),
            Scenario(
                "inf_loss",
                "inf_loss",
                "L3",
                _NONFINITE,
                "holds",
                True,
                summary="+Inf in the loss, braked like a NaN.",
            ),
            Scenario(
                "nan_grad",
                "nan_grad",
                "L3",
                ("update-refused-by-guard", *_NONFINITE[:1]),
                "holds",
                True,
                summary="NaN in the gradients only: the loss looks fine, the guard refuses the "
                "update and the L3 rule brakes.",
            ),
            Scenario(
                "heartbeat_loss",
                "heartbeat_loss",
                "L3",
                (HEARTBEAT_RULE,),
                "holds",
                False,
                summary="The loop stops stepping: heartbeats stop, the watchdog's L3 asks for "
                "checkpoint_and_pause, which the stalled loop takes at once; the page still goes "
                "out although the next heartbeat resolved the alert.",
            ),
            Scenario(
                "xid",
                "xid",
                "L4",
                ("hardware-error",),
                "exits",
                False,
                params={"xid": 79},
                summary="GPU XID 79 on one node: L4 terminates the job and isolates the node; "
                "the last periodic checkpoint is the one to restart from.",
            ),
            Scenario(
                "comm_failure",
                "comm_failure",
                "L4",
                ("communication-failure",),
                "exits",
                False,
                summary="A failed collective on one node: L4, as for an XID.",
            ),
            Scenario(
                "hang",
                "hang",
                "L3",
                (HEARTBEAT_RULE,),
                "stopped",
                False,
                summary="A hang inside the step: the brake is never acknowledged, the command "
                "expires and the executor stops the process (SIGTERM, then SIGKILL).",
            ),
            Scenario(
                "lr_spike",
                "lr_spike",
                "L3",
                ("non-finite-loss-or-gradients", "loss-rising"),
                "holds",
                True,
                params={"factor": 1e6},
                summary="The learning rate jumps a millionfold: the loss diverges and the L3 "
                "rules brake.",
            ),
            Scenario(
                "checkpoint_disk_full",
                "checkpoint_disk_full",
                "L3",
                _NONFINITE,
                "holds",
                True,
                brake_saves=False,
                summary="NaN, and the brake's checkpoint save fails (ENOSPC): the job still "
                "pauses, keeps its accelerators (no release), and the scorecard shows the brake "
                "saved nothing; the last periodic checkpoint is the one to restart from.",
            ),
            Scenario(
                "poisoned_batch",
                "nan_loss",
                "L3",
                _NONFINITE,
                RECOVERS,
                True,
                summary="One poisoned batch (NaN) under a recover rule: the L3 brake, the "
                "verdict RECOVER recorded before acting, the roll back to the clean checkpoint, "
                "the batch skipped, training resumed — the automatic recovery path, on the "
                "drill's own sandbox.",
            ),
        )
    }
)
# The full drill set of the default pack (``all``): every scenario, each verified end to end in
# CI (tests/breakers/drills/test_drill_end_to_end.py).
DRILL_SET: tuple[str, ...] = tuple(SCENARIOS)


def rehearses_recovery(name: str) -> bool:
    """Whether the scenario ``name`` drills the automatic recovery path: its sandbox's brake
    gets a verdict as a real job's would, where an ordinary drill's always holds."""
    scenario = SCENARIOS.get(name)
    return scenario is not None and scenario.release == RECOVERS


def covering(rule_key: str) -> list[str]:
    """The scenarios that rehearse ``rule_key`` (what must be drilled again after it changed)."""
    return [name for name, scenario in SCENARIOS.items() if rule_key in scenario.rules]


def resolve(names: list[str] | tuple[str, ...]) -> list[Scenario]:
    """Scenario names (or ``all``, the full drill set; ``every`` is its older synonym) →
    scenarios; ValueError naming an unknown one."""
    if list(names) in (["all"], ["every"]):
        names = DRILL_SET
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown or not names:
        raise ValueError(
            f"unknown scenario {', '.join(unknown) or '(none)'}; known: all, {', '.join(SCENARIOS)}"
        )
    return [SCENARIOS[name] for name in dict.fromkeys(names)]
