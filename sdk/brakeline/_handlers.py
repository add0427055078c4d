"""What each console command does. All of it runs in the training thread, at a step boundary.

A handler returns the result to acknowledge as succeeded, raises :class:`CommandFailed` (or any
exception) to acknowledge as failed, or returns :data:`ACK_LATER` when it acknowledges by itself
(the pause commands must confirm *before* they block). The pause commands only start the run's
pause controller (``_pause.py``), which owns the order save, confirm, release, hold.

The built-in behaviour needs of the run only what :class:`brakeline._roles.CommandTarget`
names; the pause commands get their run's pause controller bound in, and ``inject_fault``
its run's drill faults (:func:`builtin_handlers`); your handlers receive the run itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from brakeline._commands import ACK_LATER, KINDS, Command, CommandFailed
from brakeline._drill import DrillFaults, inject_fault
from brakeline._pause import PauseController, PauseInfo
from brakeline._roles import CommandTarget, TargetT

# Optimizer param-group keys and scheduler attributes that carry a learning rate. Schedulers
# recompute the lr from these, so scaling only group["lr"] would be undone at the next step.
LR_GROUP_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")
LR_SCHEDULER_ATTRIBUTES = ("base_lrs", "max_lrs", "_last_lr")

# Your handler: ``handler(run, command, step)``, the run typed as where it is registered.
Handler = Callable[[TargetT, Command, int], Any]
# A built-in handler: any run will do.
Builtin = Callable[[CommandTarget, Command, int], Any]


def _scaled(value: Any, factor: float) -> Any:
    if hasattr(value, "mul_"):  # a tensor lr (capturable optimizers): keep the same tensor
        return value.mul_(factor)
    return value * factor


def _scale_scheduler(scheduler: Any, factor: float) -> None:
    for attribute in LR_SCHEDULER_ATTRIBUTES:
        values = getattr(scheduler, attribute, None)
        if isinstance(values, list):
            setattr(scheduler, attribute, [_scaled(v, factor) for v in values])
    for inner in getattr(scheduler, "_schedulers", []) or []:  # SequentialLR, ChainedScheduler
        _scale_scheduler(inner, factor)


def lower_lr(run: CommandTarget, command: Command, step: int) -> dict[str, Any]:
    factor = command.params.get("factor", 0.5)
    if (
        isinstance(factor, bool)
        or not isinstance(factor, (int, float))
        or not math.isfinite(factor)
        or not 0 < factor <= 1
    ):
        raise CommandFailed(f"lower_lr needs a factor in (0, 1], got {factor!r}")
    optimizers = run.training.optimizers
    if not optimizers:
        raise CommandFailed("no optimizer registered: call run.watch(optimizer=...)")
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for key in LR_GROUP_KEYS:
                if key in group and group[key] is not None:
                    group[key] = _scaled(group[key], factor)
    for scheduler in run.training.schedulers:
        _scale_scheduler(scheduler, factor)
    return {
        "step": step,
        "effective_from_step": step + 1,
        "factor": factor,
        "lrs": [[float(group["lr"]) for group in opt.param_groups] for opt in optimizers],
    }


def pause_data(pause: PauseController, run: CommandTarget, command: Command, step: int) -> Any:
    refusal = pause.refusal(step)
    if refusal is not None:
        return refusal
    return pause.pause_data(command, step)


def resume(
    pause: PauseController, run: CommandTarget, command: Command, step: int
) -> dict[str, Any]:
    # Reached only when nothing was held (a pause's own hold takes the resume that ends it).
    pause.data_paused = False
    restored = run.roll_back(command.params) if command.params.get("checkpoint") else {}
    return {"step": step, "was_paused": False, **restored}


def checkpoint_and_pause(
    pause: PauseController, run: CommandTarget, command: Command, step: int
) -> Any:
    """Fixed order: we are between steps (stopped), save, confirm, release, then hold."""
    refusal = pause.refusal(step)
    if refusal is not None:
        return refusal
    pause.checkpoint_and_pause(command, step, lambda: run.checkpoint(step, reason="brake"))
    return ACK_LATER


def terminate(run: CommandTarget, command: Command, step: int) -> Any:
    run.terminate(command, step)
    return ACK_LATER


def isolate_node(run: CommandTarget, command: Command, step: int) -> Any:
    # Answered at once, by every rank that gets it (one answer settles it for the job): a
    # training process cannot drain its own node, and a command nobody answers lingers.
    node = command.params.get("node") or "the node"
    raise CommandFailed(
        f"this run cannot take {node} out of service: register a handler with "
        "run.on_command('isolate_node', handler) that does (the console drains nodes itself "
        "only for Slurm jobs)",
        {"step": step},
    )


def builtin_handlers(pause: PauseController, drill: DrillFaults) -> dict[str, Builtin]:
    """The built-in behaviour of every kind, for the run whose pauses ``pause`` controls and
    whose fire-drill faults ``drill`` plans."""
    builtins: dict[str, Builtin] = {
        "lower_lr": lower_lr,
        "pause_data": partial(pause_data, pause),
        "resume": partial(resume, pause),
        "checkpoint_and_pause": partial(checkpoint_and_pause, pause),
        "terminate": terminate,
        "isolate_node": isolate_node,
        "inject_fault": partial(inject_fault, drill),
    }
    assert set(builtins) == set(KINDS)
    return builtins


def unknown_kind(run: CommandTarget, command: Command, step: int) -> Any:
    raise CommandFailed(f"unknown command kind {command.kind!r}; this SDK knows {', '.join(KINDS)}")


# Kinds whose built-in behaviour is only "not applicable here": a handler replaces it.
FALLBACK_KINDS = frozenset({"isolate_node"})


def composed(
    custom: Handler[TargetT] | None, kind: str, builtins: Mapping[str, Builtin]
) -> Handler[TargetT]:
    """What applying a command of ``kind`` runs: your handler first, then the built-in
    behaviour, so a handler for ``resume`` cannot leave the run paused by accident.

    Your handler's answer decides: a dict (or None) → the built-in behaviour follows and the
    acknowledgement carries both results; ``ACK_LATER`` → your handler took the command over
    (it acknowledges itself, the built-in behaviour does not run); an exception → the
    acknowledgement is failed and nothing else happens (a failed resume leaves the run paused).
    """
    builtin = builtins.get(kind)
    if custom is None:
        return builtin or unknown_kind
    if builtin is None or kind in FALLBACK_KINDS:
        return custom

    def both(run: TargetT, command: Command, step: int) -> Any:
        mine = custom(run, command, step)
        if mine is ACK_LATER:
            return ACK_LATER
        # Merged into this command's acknowledgement, whoever sends it (a pause acks itself).
        run.handler_results[str(command.id)] = dict(mine) if isinstance(mine, dict) else {}
        return builtin(run, command, step)

    return both


__all__ = [
    "ACK_LATER",
    "builtin_handlers",
    "CommandFailed",
    "PauseInfo",
    "composed",
    "unknown_kind",
]
