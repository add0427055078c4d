"""The step guard: a non-finite loss or gradient never reaches the weights.

``run.watch(optimizer=...)`` wraps each watched optimizer's ``step`` (and each watched
scheduler's ``step``). Before the optimizer applies an update, the guard checks the gradients
it is about to use (and the loss given to ``run.guard(loss)``): if any value is NaN or ±Inf,
the update is skipped, as AMP's GradScaler skips an overflowing step, and the scheduler's step
that follows is skipped too, so the step leaves no trace in the training state. At the step
boundary that follows, the run flushes the offending point to the console at once and holds
until the console's rules answer (usually ``checkpoint_and_pause``, which then saves this last
good state) or ``guard_hold_seconds`` pass.

A closure passed to ``step`` (Lightning's automatic and manual optimisation pass one) is called
by the guard first, so the gradients it computes and the loss it returns are checked before the
optimizer may update; the optimizer's own first call gets that evaluation back. Optimizers that
evaluate again (LBFGS) have every later evaluation checked too, and are put back as they were
when one is not finite.

On the CPU the check reads its flag at once: the tensors are already in host memory. On an
accelerator, reading the flag in the same step would stall the host every step, so the update
is refused on the device instead (brakeline._guard_device: ``found_inf`` for fused optimizers,
a masked update for the others) and the flag is read on the host one step later, for the
report and the hold only: that next update is refused too, and the run holds after it.
``guard_device="always"`` takes the device path on the CPU as well (the suite proves it there);
``guard_device="late"`` keeps the old behaviour, which lets one update through
(``poisoned_updates``) but copies nothing.

With ``rerun_nonfinite``, a refused step computed by a closure is evaluated once more from
the state the refusal kept, to tell a batch that always gives NaN from a one-off fault of the
hardware (brakeline._attribute): at once on the host path, when the flag is read on the device
path.

Thread-safety: everything here runs in the training thread (optimizer.step, scheduler.step,
step_boundary); nothing is shared with the background threads.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import types
from collections.abc import Callable
from typing import Any

from brakeline._attribute import Rerun
from brakeline._guard_device import (
    DeviceMask,
    HostFlag,
    HostState,
    any_flag,
    fused_step,
    primary_device,
    takes_found_inf,
)
from brakeline._shards import agree, local, mesh_groups

logger = logging.getLogger("brakeline")

MAX_RECORDED_STEPS = 100
DEVICE_MODES = ("auto", "always", "late")


def _gradients(optimizer: Any) -> list[Any]:
    """The gradients the optimizer is about to use; of a sharded parameter, this rank's shard
    (brakeline._shards)."""
    grads = []
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            grad = getattr(parameter, "grad", None)
            if grad is not None:
                grad = local(grad)
                grads.append(grad.coalesce().values() if grad.is_sparse else grad)
    return grads


class _Agreement:
    """How an optimizer's ranks agree on a flag: over the meshes its parameters are sharded
    on (found once per optimizer), or not at all (every rank has the whole gradients)."""

    def __init__(self, optimizer: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        self.groups = mesh_groups(params)
        self.device = local(params[0]).device if self.groups else None

    def __call__(self, flags: list[Any]) -> list[Any]:
        if not self.groups:
            return flags
        return agree(flags, self.groups, self.device)


def _nonfinite_flag(tensors: list[Any]) -> list[Any]:
    """A 0-d bool tensor per device: True if any element is NaN/±Inf (no host sync).

    A tensor's min and max (one pass, ``aminmax``) are finite exactly when all its elements
    are, and cannot overflow as a sum could: about 12x cheaper on the CPU than testing every
    element with ``isfinite`` (bench/sdk_overhead.py)."""
    import torch

    by_device: dict[Any, list[Any]] = {}
    for tensor in tensors:
        if tensor.numel() and (tensor.is_floating_point() or tensor.is_complex()):
            by_device.setdefault(tensor.device, []).append(tensor)
    flags = []
    for group in by_device.values():
        extremes: list[Any] = []
        for tensor in group:
            try:
                extremes.extend(torch.aminmax(tensor))
            except (RuntimeError, TypeError):  # complex, or a dtype without aminmax here
                extremes.append(torch.logical_not(torch.isfinite(tensor)).any().float())
        flags.append(torch.logical_not(torch.isfinite(torch.stack(extremes))).any())
    return flags


class StepGuard:
    """Skips optimizer (and scheduler) steps whose inputs are not finite; see the module doc."""

    def __init__(self, current_step: Callable[[], int], device_mode: str = "auto") -> None:
        self._current_step = current_step  # the step being computed: run.step + 1
        self.enabled = True
        # "auto": the device path where a flag lives on an accelerator; "always": also on the
        # CPU (the same code path, so CPU tests prove it); "late": report only, no copies.
        if device_mode not in DEVICE_MODES:
            raise ValueError(f"guard_device must be one of {DEVICE_MODES}, not {device_mode!r}")
        self.device_mode = device_mode
        # The step whose update was skipped and not yet handed to the console (a hold).
        self.tripped_step: int | None = None
        self.skipped_updates: list[int] = []  # steps whose update never reached the weights
        self.poisoned_updates: list[int] = []  # "late" mode: updates the lagging flag let by
        self.weights_step: int | None = None  # the last step whose update was applied
        self._loss_flags: list[Any] = []
        self._pending: list[_Pending] = []  # device flags of past steps, read one step late
        self._wrapped: set[int] = set()
        self._agreements: dict[int, _Agreement] = {}  # per optimizer
        self._grad_counters: list[Any] = []  # NonFiniteCounters the guard counts for
        self._schedulers: list[Any] = []
        # (scheduler, its state before the skipped step, its optimizer's lrs): rewound at the
        # step boundary, so the schedule does not advance for an update that never happened.
        self._rewind: list[tuple[Any, dict[str, Any], list[Any]]] = []
        # Re-run to attribute a refused step computed by a closure (brakeline._attribute).
        self.rerun = Rerun()

    # -- installation ----------------------------------------------------------------------------
    def watch(self, optimizers: list[Any], schedulers: list[Any], step: int) -> bool:
        """Guard every watched optimizer (and rewind its schedulers after a refused update);
        True when the guard is on and has an optimizer to guard. Until an update is applied,
        the weights hold the updates of ``step``, the run's step when they were first watched."""
        for optimizer in optimizers:
            self.watch_optimizer(optimizer)
        for scheduler in schedulers:
            self.watch_scheduler(scheduler)
        guarded = self.enabled and bool(optimizers)
        if self.weights_step is None and guarded:
            self.weights_step = step
        return guarded

    def watch_optimizer(self, optimizer: Any) -> None:
        if id(optimizer) in self._wrapped or not hasattr(optimizer, "param_groups"):
            return
        self._wrapped.add(id(optimizer))
        original = optimizer.step
        guard = self

        # wraps: keeps what an LR scheduler marked on the step it wrapped (no false warning).
        @functools.wraps(original)
        def guarded_step(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if not guard.enabled:
                return original(*args, **kwargs)
            closure = kwargs.pop("closure", None) if "closure" in kwargs else None
            if closure is None and args and callable(args[0]):
                closure, args = args[0], args[1:]
            return guard.step(opt, original, closure, args, kwargs)

        # A bound method, like the original: LR schedulers wrap ``step.__func__``.
        optimizer.step = types.MethodType(guarded_step, optimizer)

    def watch_scheduler(self, scheduler: Any) -> None:
        # Not wrapped: a scheduler's state_dict is its __dict__, which would then carry the
        # wrapper into every checkpoint. Its step after a skipped update is rewound instead.
        if getattr(scheduler, "optimizer", None) is not None and scheduler not in self._schedulers:
            self._schedulers.append(scheduler)

    def counts_gradients_of(self, model: Any) -> bool:
        """The guard can count the model's non-finite gradients for its counter: it reads its
        flag on the host at once (every parameter in host memory, no forced device path)."""
        if self.device_mode == "always":
            return False
        return all(p.device.type == "cpu" for p in model.parameters())

    def count_into(self, counter: Any) -> None:
        """Report non-finite gradient counts to ``counter`` (its hooks are not installed)."""
        counter.watches_gradients = True
        self._grad_counters.append(counter)

    def resumed_at(self, step: int) -> None:
        """A framework restored its checkpoint of ``step``: the weights hold its updates (as
        far as a guard that watches the optimizers can say; otherwise nothing is claimed)."""
        if self.enabled and self._wrapped:
            self.weights_step = step

    # -- the check -------------------------------------------------------------------------------
    def guard_loss(self, loss: Any) -> None:
        """Also refuse this step's update when ``loss`` is not finite (``run.guard(loss)``)."""
        if hasattr(loss, "detach"):
            self._loss_flags.extend(_nonfinite_flag([loss.detach().reshape(-1)]))
        elif isinstance(loss, float) and not math.isfinite(loss):
            import torch

            self._loss_flags.append(torch.ones((), dtype=torch.bool))

    def step(self, optimizer: Any, original: Any, closure: Any, args: Any, kwargs: Any) -> Any:
        """The guarded ``optimizer.step``: the closure (if any) runs first, its loss and the
        gradients it left are checked, and only then does the optimizer update."""
        step = self._current_step()
        earlier_trip = self._read_pending(step, may_rerun=closure is not None)
        evaluations = None
        if closure is not None:
            evaluations = _Evaluations(closure, self, optimizer)
            evaluations.streams = self.rerun.before_first()
            evaluations.first()
        flags = self.agreed(optimizer, _nonfinite_flag(_gradients(optimizer)) + self._loss_flags)
        self._loss_flags = []
        if earlier_trip:  # a refused update seen only now: this one is refused with it
            self._skip(optimizer, step)
            return evaluations.loss if evaluations else None
        if self._on_device(flags):
            return self._device_step(optimizer, original, evaluations, flags, args, kwargs)
        if any(bool(flag) for flag in flags):
            self._count_nonfinite_gradients(optimizer)
            self._skip(optimizer, step)
            if evaluations is not None:  # the pre-step state is intact: re-run it, if opted in
                self._attribute(step, evaluations)
            return evaluations.loss if evaluations else None
        if evaluations is None:
            result = original(*args, **kwargs)
        else:
            snapshot = _Snapshot(optimizer) if _reevaluates(optimizer) else None
            result = original(evaluations, *args, **kwargs)
            if any(bool(flag) for flag in evaluations.later_flags):
                if snapshot is None:  # not known to re-evaluate: nothing to put back
                    self._let_through(step)
                    return result
                snapshot.restore()
                self._skip(optimizer, step)
                return evaluations.loss
        self.weights_step = step
        return result

    def agreed(self, optimizer: Any, flags: list[Any]) -> list[Any]:
        """``flags``, or, where the optimizer's parameters are sharded, the flag every rank
        holding a shard of them agrees on (brakeline._shards)."""
        agreement = self._agreements.get(id(optimizer))
        if agreement is None:
            agreement = self._agreements[id(optimizer)] = _Agreement(optimizer)
        return agreement(flags)

    def _attribute(self, step: int, evaluations: _Evaluations) -> None:
        """Re-run a refused step's closure from its unchanged pre-step state, when the run
        opted in (brakeline._attribute). Loss flags the closure raises itself
        (``run.guard``) are the re-run's, not the next step's."""
        if evaluations.streams is None:
            return
        optimizer, held, self._loss_flags = evaluations.optimizer, self._loss_flags, []

        def repeats(loss: Any) -> bool:
            if isinstance(loss, float) and not math.isfinite(loss):
                return True
            tensors = [loss.detach().reshape(-1)] if hasattr(loss, "detach") else []
            flags = _nonfinite_flag(tensors + _gradients(optimizer)) + self._loss_flags
            return any(bool(flag) for flag in self.agreed(optimizer, flags))

        try:
            self.rerun.attribute(step, evaluations.closure, evaluations.streams, repeats)
        finally:
            self._loss_flags = held

    def _let_through(self, step: int) -> None:
        self.weights_step = step
        _remember(self.poisoned_updates, step)
        if self.tripped_step is None:
            self.tripped_step = step
        logger.error(
            "brakeline: the optimizer evaluated its closure again at step %d and got non-finite "
            "values: the update went through (set optimizer.brakeline_reevaluates = True to "
            "have it put back); holding for the console",
            step,
        )

    def _count_nonfinite_gradients(self, optimizer: Any) -> None:
        if not self._grad_counters:
            return
        import torch

        from brakeline.torch import count_nonfinite

        total = torch.tensor(sum(int(count_nonfinite(grad)) for grad in _gradients(optimizer)))
        for counter in self._grad_counters:
            counter.add_gradient_count(total)

    def _on_device(self, flags: list[Any]) -> bool:
        if self.device_mode == "always":
            return bool(flags)
        return any(flag.device.type != "cpu" for flag in flags)

    def _device_step(
        self,
        optimizer: Any,
        original: Any,
        evaluations: _Evaluations | None,
        flags: list[Any],
        args: Any,
        kwargs: Any,
    ) -> Any:
        step = self._current_step()
        device = primary_device(optimizer) or flags[0].device
        flag = any_flag(flags, device)
        call_args = args if evaluations is None else (evaluations, *args)
        pending = _Pending(step, self.weights_step, self._scheduler_states(optimizer))
        if evaluations is not None and self.device_mode != "late":  # the mask keeps the state
            pending.evaluations = evaluations
        if self.device_mode == "late":
            result = original(*call_args, **kwargs)
        elif takes_found_inf(optimizer) and not _reevaluates(optimizer):
            result = fused_step(optimizer, original, flag, call_args, kwargs)
        else:
            mask = DeviceMask(optimizer, device)
            result = original(*call_args, **kwargs)
            if evaluations is not None and evaluations.later_flags:
                flag = any_flag([flag, *evaluations.later_flags], device)
            mask.apply(flag)
            pending.host_state = mask.host
        pending.flag = HostFlag(flag)
        self._pending.append(pending)
        # Provisional: the host learns one step later whether the device applied it.
        self.weights_step = step
        return result if evaluations is None else evaluations.loss

    def _scheduler_states(self, optimizer: Any) -> list[tuple[Any, dict[str, Any], list[Any]]]:
        states = []
        for scheduler in self._schedulers:
            if scheduler.optimizer is optimizer:
                state = {
                    key: list(value) if isinstance(value, list) else value
                    for key, value in scheduler.state_dict().items()
                }
                states.append((scheduler, state, [g.get("lr") for g in optimizer.param_groups]))
        return states

    def _read_pending(self, step: int, may_rerun: bool = True) -> bool:
        """Read the device flags of earlier steps (one step old: no stall); True if one was
        set. A refused update is settled here: host state, schedule and weights_step; then,
        the weights being those from before it again, its closure may be re-run (not over
        gradients a later backward left for the optimizer: ``may_rerun``)."""
        earlier = [pending for pending in self._pending if pending.step < step]
        if not earlier:
            return False
        self._pending = [pending for pending in self._pending if pending.step >= step]
        tripped = False
        for pending in earlier:
            if not pending.flag.read():
                continue
            tripped = True
            self._settle_refused(pending)
            if may_rerun and pending.evaluations is not None:
                self._attribute(pending.step, pending.evaluations)
        return tripped

    def settle(self) -> None:
        """Read every pending device flag now (a checkpoint: it must say what it holds)."""
        self._read_pending(self._current_step() + 1)

    def _settle_refused(self, pending: _Pending) -> None:
        if self.device_mode == "late":
            _remember(self.poisoned_updates, pending.step)
            message = "a non-finite value reached the weights at step %d (flag read late)"
        else:
            if pending.host_state is not None:
                pending.host_state.restore()
            for scheduler, state, lrs in pending.schedulers:
                scheduler.load_state_dict(state)
                for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=False):
                    group["lr"] = lr
            _remember(self.skipped_updates, pending.step)
            if self.weights_step is None or self.weights_step >= pending.step:
                self.weights_step = pending.previous_weights_step
            message = "non-finite loss or gradients at step %d: refused on the device"
        if self.tripped_step is None:
            self.tripped_step = pending.step
        logger.error("brakeline: " + message + "; holding for the console", pending.step)

    def _skip(self, optimizer: Any, step: int) -> None:
        for scheduler in self._schedulers:
            if scheduler.optimizer is optimizer:
                lrs = [group.get("lr") for group in optimizer.param_groups]
                self._rewind.append((scheduler, copy.deepcopy(scheduler.state_dict()), lrs))
        _remember(self.skipped_updates, step)
        if self.tripped_step is None:
            self.tripped_step = step
            logger.error(
                "brakeline: non-finite loss or gradients at step %d: the update was skipped "
                "(the weights keep the last good state); holding for the console",
                step,
            )

    def take_trip(self) -> int | None:
        """The step that tripped the guard since the last call, if any (step boundary); the
        schedulers stepped after the skipped update are rewound first."""
        rewind, self._rewind = self._rewind, []
        for scheduler, state, lrs in rewind:
            scheduler.load_state_dict(state)
            for group, lr in zip(scheduler.optimizer.param_groups, lrs, strict=False):
                group["lr"] = lr
        tripped, self.tripped_step = self.tripped_step, None
        return tripped

    def refused_count(self) -> int:
        """Updates refused (or, one step late, let by) so far: at least 1 after a trip."""
        return max(1, len(self.skipped_updates) + len(self.poisoned_updates))

    def report(self) -> dict[str, Any]:
        """What a checkpoint's acknowledgement says about the weights it holds."""
        self.settle()
        return {
            "weights_step": self.weights_step,
            "skipped_updates": list(self.skipped_updates[-10:]),
            "poisoned_updates": list(self.poisoned_updates[-10:]),
        }


class _Pending:
    """A device-path step whose flag the host has not read yet."""

    def __init__(self, step: int, previous: int | None, schedulers: list[Any]) -> None:
        self.step = step
        self.previous_weights_step = previous
        self.schedulers = schedulers
        self.host_state: HostState | None = None
        self.flag: Any = None
        self.evaluations: _Evaluations | None = None  # its closure, to re-run if refused


class _Evaluations:
    """The closure handed to the optimizer: its first call returns the evaluation the guard
    already made (and checked) before the update; later calls (LBFGS's line search, a
    sharpness-aware step) evaluate again, and their flags are checked after the step."""

    def __init__(self, closure: Callable[[], Any], guard: StepGuard, optimizer: Any) -> None:
        self.closure = closure
        self._guard = guard
        self.optimizer = optimizer
        # The generators before the first evaluation, for a re-run (None: not opted in).
        self.streams: dict[str, Any] | None = None
        self._calls = 0
        self.loss: Any = None
        self.later_flags: list[Any] = []

    def first(self) -> None:
        import torch

        with torch.enable_grad():
            self.loss = self.closure()
        if self.loss is not None:
            self._guard.guard_loss(self.loss)

    def __call__(self) -> Any:
        self._calls += 1
        if self._calls == 1:
            return self.loss
        loss = self.closure()
        tensors = [] if loss is None or not hasattr(loss, "detach") else [loss.detach()]
        flags = _nonfinite_flag(tensors + _gradients(self.optimizer))
        self.later_flags.extend(self._guard.agreed(self.optimizer, flags))
        return loss


def _reevaluates(optimizer: Any) -> bool:
    """Optimizers that evaluate a closure again after moving the weights (LBFGS; a
    sharpness-aware one that says so): their step is copied first, so it can be put back.
    Every other one evaluates once, before it updates, and copies nothing."""
    marked = getattr(optimizer, "brakeline_reevaluates", None)
    if marked is not None:
        return bool(marked)
    return isinstance(optimizer, _lbfgs())


def _lbfgs() -> type:
    import torch

    return torch.optim.LBFGS


class _Snapshot:
    """The parameters and optimizer state before a step that may evaluate its closure again."""

    def __init__(self, optimizer: Any) -> None:
        self._optimizer = optimizer
        self._state = copy.deepcopy(optimizer.state_dict())
        self._params = [
            (p, p.detach().clone()) for group in optimizer.param_groups for p in group["params"]
        ]

    def restore(self) -> None:
        import torch

        with torch.no_grad():
            for parameter, before in self._params:
                parameter.copy_(before)
        self._optimizer.load_state_dict(self._state)


def _remember(steps: list[int], step: int) -> None:
    if not steps or steps[-1] != step:
        steps.append(step)
        del steps[:-MAX_RECORDED_STEPS]
