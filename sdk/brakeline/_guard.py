"""The step guard: a non-finite loss or gradient never reaches the weights.

``run.watch(optimizer=...)`` wraps each watched optimizer's ``step`` (and each watched
scheduler's ``step``). Before the optimizer applies an update, the guard checks the gradients
it is about to use (and the loss given to ``run.guard(loss)``): if any value is NaN or ±Inf,
the update is skipped, as AMP's GradScaler skips an overflowing step, and the scheduler's step
that follows is skipped too, so the step leaves no trace in the training state. At the step
boundary that follows, the run flushes the offending point to the console at once and holds
until the console's rules answer (usually ``checkpoint_and_pause``, which then saves this last
good state) or ``guard_hold_seconds`` pass.

On the CPU the check reads its flag at once: the tensors are already in host memory. On an
accelerator, reading the flag in the same step would force a device synchronisation every step,
so the flag is copied to host memory without blocking and read at the next step: the guard is
then at most one step late, and reports the update it could not stop (``poisoned_updates``), so
the console marks checkpoints taken after it as "after the anomaly".

Thread-safety: everything here runs in the training thread (optimizer.step, scheduler.step,
step_boundary); nothing is shared with the background threads.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import time
import types
from collections.abc import Callable
from typing import Any

from brakeline._encoding import LogRecord

logger = logging.getLogger("brakeline")

MAX_RECORDED_STEPS = 100
# How long a held rank waits for the console to take its "holding" heartbeat before it sends
# the offending point: bounded, since an older console refuses the status (the brake is then
# applied a margin of steps later, as before).
HOLDING_SAID_SECONDS = 2.0


def _gradients(optimizer: Any) -> list[Any]:
    grads = []
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            grad = getattr(parameter, "grad", None)
            if grad is not None:
                grads.append(grad.coalesce().values() if grad.is_sparse else grad)
    return grads


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
        extremes = []
        for tensor in group:
            try:
                extremes.extend(torch.aminmax(tensor))
            except (RuntimeError, TypeError):  # complex, or a dtype without aminmax here
                extremes.append(torch.logical_not(torch.isfinite(tensor)).any().float())
        flags.append(torch.logical_not(torch.isfinite(torch.stack(extremes))).any())
    return flags


class StepGuard:
    """Skips optimizer (and scheduler) steps whose inputs are not finite; see the module doc."""

    def __init__(self, current_step: Callable[[], int]) -> None:
        self._current_step = current_step  # the step being computed: run.step + 1
        self.enabled = True
        # The step whose update was skipped and not yet handed to the console (a hold).
        self.tripped_step: int | None = None
        self.skipped_updates: list[int] = []  # steps whose update never reached the weights
        self.poisoned_updates: list[int] = []  # accelerators: updates the lagging flag let by
        self.weights_step: int | None = None  # the last step whose update was applied
        self._loss_flags: list[Any] = []
        self._deferred: list[tuple[int, Any]] = []  # (step, host flag) read one step late
        self._wrapped: set[int] = set()
        self._schedulers: list[Any] = []
        # (scheduler, its state before the skipped step, its optimizer's lrs): rewound at the
        # step boundary, so the schedule does not advance for an update that never happened.
        self._rewind: list[tuple[Any, dict[str, Any], list[Any]]] = []

    # -- installation ----------------------------------------------------------------------------
    def watch_optimizer(self, optimizer: Any) -> None:
        if id(optimizer) in self._wrapped or not hasattr(optimizer, "param_groups"):
            return
        self._wrapped.add(id(optimizer))
        original = optimizer.step
        guard = self

        # wraps: keeps what an LR scheduler marked on the step it wrapped (no false warning).
        @functools.wraps(original)
        def guarded_step(opt: Any, *args: Any, **kwargs: Any) -> Any:
            if not guard.enabled or args or "closure" in kwargs:
                return original(*args, **kwargs)  # a closure computes its grads inside step
            if guard._must_skip(opt):
                return None
            result = original(*args, **kwargs)
            guard.weights_step = guard._current_step()
            return result

        # A bound method, like the original: LR schedulers wrap ``step.__func__``.
        optimizer.step = types.MethodType(guarded_step, optimizer)

    def watch_scheduler(self, scheduler: Any) -> None:
        # Not wrapped: a scheduler's state_dict is its __dict__, which would then carry the
        # wrapper into every checkpoint. Its step after a skipped update is rewound instead.
        if getattr(scheduler, "optimizer", None) is not None and scheduler not in self._schedulers:
            self._schedulers.append(scheduler)

    # -- the check -------------------------------------------------------------------------------
    def guard_loss(self, loss: Any) -> None:
        """Also refuse this step's update when ``loss`` is not finite (``run.guard(loss)``)."""
        if hasattr(loss, "detach"):
            self._loss_flags.extend(_nonfinite_flag([loss.detach().reshape(-1)]))
        elif isinstance(loss, float) and not math.isfinite(loss):
            import torch

            self._loss_flags.append(torch.ones((), dtype=torch.bool))

    def _must_skip(self, optimizer: Any) -> bool:
        step = self._current_step()
        self._read_deferred(step)
        flags = _nonfinite_flag(_gradients(optimizer)) + self._loss_flags
        self._loss_flags = []
        bad = False
        for flag in flags:
            if flag.device.type == "cpu":
                bad = bad or bool(flag)
            else:
                # No sync: copy to host memory now, read at the next step (one step of lag).
                host = flag.to("cpu", non_blocking=True)
                self._deferred.append((step, host))
        if bad:
            self._skip(optimizer, step)
        return bad

    def _read_deferred(self, step: int) -> None:
        late = [s for s, host in self._deferred if s < step and bool(host)]
        self._deferred = [(s, host) for s, host in self._deferred if s >= step]
        for earlier in sorted(set(late)):
            _remember(self.poisoned_updates, earlier)
            if self.tripped_step is None:
                self.tripped_step = earlier
            logger.error(
                "brakeline: a non-finite value reached the weights at step %d (the check on an "
                "accelerator is read one step late); holding for the console",
                earlier,
            )

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
        return {
            "weights_step": self.weights_step,
            "skipped_updates": list(self.skipped_updates[-10:]),
            "poisoned_updates": list(self.poisoned_updates[-10:]),
        }


def _remember(steps: list[int], step: int) -> None:
    if not steps or steps[-1] != step:
        steps.append(step)
        del steps[:-MAX_RECORDED_STEPS]


class GuardedRunMixin:
    """The Run's guard methods: ``run.guard(loss)``, the non-finite counters attached to each
    log, and the hold after a refused update (see :class:`brakeline.Run`)."""

    # Attributes of the Run these methods use (set in Run.__init__).
    settings: Any
    step: int
    status: str
    finished: bool
    stopping: bool
    control: Any
    sender: Any
    inbox: Any
    _guard: StepGuard
    _counters: list[Any]

    def guard(self, loss: Any) -> Any:
        """Refuse this step's optimizer update if ``loss`` is NaN/±Inf (call it before
        ``optimizer.step()``; gradients are checked anyway). Returns ``loss`` unchanged."""
        try:
            self._guard.guard_loss(loss)
        except Exception:  # the guard must never break training
            logger.exception("brakeline: run.guard failed (loss not checked)")
        return loss

    def add_nonfinite_counter(self, counter: Any) -> None:
        """Use a counter built by hand (e.g. ``NonFiniteCounter(model, gradients=False)``)."""
        self._counters.append(counter)

    def _attach_nonfinite_counts(self, record: LogRecord) -> None:
        for counter in self._counters:
            losses, observed, gradients = counter.take()
            # Counts may be device tensors: add them without reading (no sync here).
            record.loss_nonfinite = (
                losses if record.loss_nonfinite is None else record.loss_nonfinite + losses
            )
            record.loss_observed += observed
            if gradients is not None:
                record.grad_nonfinite = (
                    gradients
                    if record.grad_nonfinite is None
                    else record.grad_nonfinite + gradients
                )

    def _hold_for_decision(self, tripped: int | None) -> None:
        """The guard skipped a non-finite update: send the point now and let the console's
        rules decide (normally checkpoint_and_pause, which saves this last good state)."""
        if self.control is None or self.finished or self.stopping:
            return  # offline: the skipped update is all the guard can do
        # Said first (a heartbeat goes at once): a console that knows every rank holds
        # applies its brake at the held step, not a margin of steps later (docs/protocol.md).
        previous = self.status
        self.status = "holding"
        self.control.say_status("holding", min(self.settings.http_timeout, HOLDING_SAID_SECONDS))
        try:
            self._wait_for_decision(tripped)
        finally:
            if self.status == "holding":
                self.status = previous

    def _wait_for_decision(self, tripped: int | None) -> None:
        if self.sender is not None:
            # Said in so many words: a NaN gradient need not show in any logged metric. The
            # default rule pack brakes on it (update-refused-by-guard, L3).
            self.sender.submit(
                LogRecord(
                    step=tripped if tripped is not None else self.step,
                    time=time.time(),
                    metrics={"guard.skipped_updates": float(self._guard.refused_count())},
                )
            )
        self.flush(min(self.settings.guard_hold_seconds, self.settings.http_timeout))
        deadline = time.monotonic() + self.settings.guard_hold_seconds
        while not (self.finished or self.inbox.has_pending):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logger.error(
                    "brakeline: no console decision %.0f s after the non-finite step %s; "
                    "training goes on (that update was skipped)",
                    self.settings.guard_hold_seconds,
                    tripped,
                )
                return
            self.keepalive()  # held on purpose: heartbeats must not turn this into a hang
            self.inbox.wait(min(remaining, 0.25))
