"""Fire drills: faults injected on purpose, in a drill sandbox only (docs/drills.md).

The console sends ``inject_fault {"fault": "nan_loss", "at_step": 200}`` to a job it created as
a drill sandbox; the SDK refuses it anywhere else — the console refuses to issue it to an
ordinary job, and this process refuses to apply it unless ``BRAKELINE_DRILL_SANDBOX=1`` is in
its environment (the drill runner sets it), so one slip on either side cannot poison a real
training run.

Faults live where real ones do: in the tensors and in the training thread. A forward hook on
each watched model fires at ``at_step`` (the step about to run is ``run.step + 1``): a NaN or
±Inf enters the model's output (so the loss, the gradients, the SDK's step guard and the
console's rules all see it), or enters only the gradients through a tensor hook on that output;
the learning rate spikes; the training thread stops stepping (no progress: heartbeats stop)
until a console command arrives, or hangs inside the step for good; a GPU XID or a failed
collective is reported for this node; the next checkpoint save fails (disk full, permission).
The fault's own step is logged as the metric ``drill.fault`` (no rule watches ``drill.*``), so
the drill measures detection from the moment the fault really happened.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from brakeline._commands import Command, CommandFailed
from brakeline._roles import CommandTarget

logger = logging.getLogger("brakeline")

SANDBOX_VARIABLE = "BRAKELINE_DRILL_SANDBOX"
FAULT_METRIC = "drill.fault"

# What each fault does, in one word the drill runner and the docs share.
FAULTS: dict[str, str] = {
    "nan_loss": "NaN in the model's output, so in the loss and the gradients",
    "inf_loss": "+Inf in the model's output",
    "nan_grad": "NaN in the gradients only (the loss stays finite)",
    "inf_grad": "+Inf in the gradients only",
    "lr_spike": "the learning rate multiplied by params.factor (default 1000): divergence",
    "heartbeat_loss": "the loop stops stepping (no progress, no heartbeat) until a command, and "
    "params.answer_after seconds more",
    "hang": "the training thread hangs inside the step, for good",
    "xid": "a GPU XID (params.xid, default 79) reported on this node",
    "comm_failure": "a failed collective operation reported on this node",
    "checkpoint_disk_full": "NaN in the loss, and the checkpoint save fails with ENOSPC",
    "checkpoint_permission": "NaN in the loss, and the checkpoint save fails with EACCES",
}
POISONING = {"nan_loss": math.nan, "inf_loss": math.inf}
GRADIENT_POISONING = {"nan_grad": math.nan, "inf_grad": math.inf}
FAILING_SAVES = {
    "checkpoint_disk_full": (errno.ENOSPC, "No space left on device"),
    "checkpoint_permission": (errno.EACCES, "Permission denied"),
}


def is_sandbox(environ: Any = None) -> bool:
    return (environ if environ is not None else os.environ).get(SANDBOX_VARIABLE) == "1"


RELEASE_MARKER_VARIABLE = "BRAKELINE_DRILL_RELEASE_MARKER"


def note_release(hooks_run: int, step: int, environ: Any = None) -> None:
    """In a drill sandbox, leave the drill a note that the release hooks ran (how many, at
    which step): the scorecard's "release" line reads it, whichever training script ran —
    the built-in workload or a team's own. Nothing happens outside a sandbox."""
    environ = environ if environ is not None else os.environ
    path = environ.get(RELEASE_MARKER_VARIABLE)
    if not path or not is_sandbox(environ):
        return
    try:
        with open(path, "w", encoding="ascii") as marker:
            marker.write(f"{hooks_run} {step}\n")
    except OSError as error:  # the drill then reads "did not run": never the pause's problem
        logger.warning("brakeline: could not note the release for the drill: %s", error)


@dataclass
class PlannedFault:
    fault: str
    at_step: int
    params: dict[str, Any] = field(default_factory=dict)
    fired: bool = False


def parse_fault(params: Any, step: int) -> PlannedFault:
    """The command's params checked: a known fault, a whole at_step (the next step when it is
    already past)."""
    if not isinstance(params, dict):
        raise CommandFailed("inject_fault needs params {fault, at_step}")
    fault, at_step = params.get("fault"), params.get("at_step", step + 1)
    if fault not in FAULTS:
        raise CommandFailed(f"unknown fault {fault!r}; this SDK knows {', '.join(FAULTS)}")
    if isinstance(at_step, bool) or not isinstance(at_step, int) or at_step < 0:
        raise CommandFailed(f"at_step must be a whole step number, got {at_step!r}")
    extra = {k: v for k, v in params.items() if k not in ("fault", "at_step")}
    return PlannedFault(fault, max(at_step, step + 1), extra)


class DrillFaults:
    """The faults planned for one run, fired from forward hooks of its watched models (the
    hooks are registered with the first fault planned: an ordinary run has none)."""

    def __init__(self, run: CommandTarget) -> None:
        self.run = run
        self.planned: list[PlannedFault] = []
        self._hooked: set[int] = set()

    def plan(self, fault: PlannedFault) -> None:
        models = self.run.training.models
        if not models:
            raise CommandFailed("no model watched: call run.watch(model=...) before a drill")
        for model in models:
            if id(model) not in self._hooked:
                self._hooked.add(id(model))
                model.register_forward_pre_hook(self._before_forward)
                model.register_forward_hook(self._after_forward)
        self.planned.append(fault)

    def _due(self) -> list[PlannedFault]:
        step = self.run.step + 1
        return [f for f in self.planned if not f.fired and f.at_step <= step]

    def _announce(self, fault: PlannedFault) -> None:
        fault.fired = True
        step = self.run.step + 1
        logger.warning("brakeline: DRILL fault %s fired at step %d", fault.fault, step)
        self.run.log({FAULT_METRIC: 1.0}, step=step)

    def _before_forward(self, module: Any, inputs: Any) -> None:
        for fault in self._due():
            kind = fault.fault
            if kind in POISONING or kind in GRADIENT_POISONING or kind in FAILING_SAVES:
                continue  # these act on the output (after forward)
            self._announce(fault)
            if kind == "lr_spike":
                self._spike_lr(float(fault.params.get("factor", 1000.0)))
            elif kind == "heartbeat_loss":
                params = fault.params
                self._stop_stepping(
                    float(params.get("seconds", 600.0)), float(params.get("answer_after", 0.0))
                )
            elif kind == "hang":
                threading.Event().wait()  # inside the step, for good: only a signal ends it
            elif kind == "xid":
                self.run.log({"gpu.0.xid": float(fault.params.get("xid", 79))})
            elif kind == "comm_failure":
                self.run.log({"comm.failures": 1.0})

    def _after_forward(self, module: Any, inputs: Any, output: Any) -> Any:
        for fault in self._due():
            kind = fault.fault
            if kind in POISONING:
                self._announce(fault)
                output = output + POISONING[kind]
            elif kind in FAILING_SAVES:
                self._announce(fault)
                self._fail_saves(*FAILING_SAVES[kind])
                output = output + math.nan
            elif kind in GRADIENT_POISONING:
                self._announce(fault)
                bad = GRADIENT_POISONING[kind]
                output.register_hook(lambda grad, bad=bad: grad * bad)
        return output

    def _spike_lr(self, factor: float) -> None:
        for optimizer in self.run.training.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * factor

    def _stop_stepping(self, seconds: float, answer_after: float) -> None:
        # No keepalive on purpose: the heartbeats then carry no progress and stop, as those of
        # a stuck loop do. ``answer_after`` seconds after a command (the console's brake)
        # arrived, the stall ends and the command is applied at the boundary that follows.
        deadline = time.monotonic() + seconds
        while not self.run.inbox.has_pending and time.monotonic() < deadline:
            self.run.inbox.wait(0.25)
        time.sleep(max(0.0, min(answer_after, deadline - time.monotonic())))

    def _fail_saves(self, code: int, message: str) -> None:
        def failing_saver(path: Any, step: int) -> None:
            raise OSError(code, f"{message} (drill)", str(path))

        # An instance attribute shadows the method: every later default save fails.
        self.run.training.torch_saver = failing_saver  # type: ignore[method-assign]


def inject_fault(
    faults: DrillFaults, run: CommandTarget, command: Command, step: int
) -> dict[str, Any]:
    """The ``inject_fault`` command: refused outside a drill sandbox, else planned among the
    run's ``faults``."""
    if not is_sandbox():
        raise CommandFailed(
            f"inject_fault refused: this process is not a drill sandbox ({SANDBOX_VARIABLE} "
            "is not set); faults are only injected into drill jobs"
        )
    fault = parse_fault(command.params, step)
    faults.plan(fault)
    return {"step": step, "fault": fault.fault, "at_step": fault.at_step}
