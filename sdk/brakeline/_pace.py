"""Where a rank is in its step, for the console's hang and straggler verdicts.

Under synchronous data parallelism every rank waits for the slowest in the gradient
all-reduce, so step intervals are the same on every rank and say nothing of which one is slow;
and when one rank hangs, the others block in its collective and fall silent with it. Two facts
tell the ranks apart, measured here without a device sync:

- ``compute_seconds``: a rank's own work per step — from the step's start (the end of the
  previous ``step_boundary``, after whatever the SDK did there: commands, a pause, a save) to
  the moment its last gradient bucket is ready for the all-reduce (a DDP communication hook,
  which then runs DDP's own all-reduce), so the wait for the other ranks is left out. Without
  a DDP model, to the next boundary. The first ``WARMUP_STEPS`` steps after the process starts
  or a hold ends (a resume, a roll back) are not counted: caches, workers and compilation make
  them slow on some ranks and not others.
- ``sync_step``: the latest step whose gradient all-reduce this rank entered. A rank blocked in
  step N+1's all-reduce says ``sync_step`` N+1 with ``step`` N; the rank it waits for never
  entered it. Entering one counts as news for one heartbeat, so the waiting ranks say so before
  they fall silent.

The hook runs in autograd's thread, the heartbeat in the control thread: the state the latter
reads is replaced whole (a tuple), atomic under the GIL; a sample lost to a race is one of many.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("brakeline")

WARMUP_STEPS = 5


class StepPace:
    """One rank's step clock: its compute time per step and the gradient sync it entered."""

    def __init__(self, next_step: Callable[[], int], now: Callable[[], float] = time.monotonic):
        self._next_step = next_step  # the step being computed (the last boundary's + 1)
        self._now = now
        self._started: float | None = None
        self._measured = False  # this step's compute was taken by the hook
        self._warmup = WARMUP_STEPS
        self._samples: tuple[float, int] = (0.0, 0)  # compute seconds summed, steps
        self.sync_step: int | None = None
        self.entered = 0  # gradient syncs entered: news for the heartbeat
        self.hooked = False

    # -- the training thread ----------------------------------------------------------------
    def step_ended(self) -> None:
        """At the start of step_boundary: a step without a hooked sync ends its compute here."""
        if not self._measured and self._started is not None:
            self._count(self._now() - self._started)
        self._measured = False

    def step_started(self) -> None:
        """At the end of step_boundary: the next step's work starts now."""
        self._started = self._now()

    def skip_step(self) -> None:
        """Something not the step's own work ran inside it (a checkpoint): not measured."""
        self._measured = True

    def restart(self) -> None:
        """A hold ended (pause, resume, roll back) or a save ran mid-step: warm up again, and
        the step under way is not measured."""
        self._warmup = WARMUP_STEPS
        self._started = None  # the step under way (if any) has no start to measure from

    # -- the DDP hook (autograd's thread) ---------------------------------------------------
    def bucket_ready(self, is_last: bool) -> None:
        step = self._next_step()
        if self.sync_step != step:
            self.sync_step = step
            self.entered += 1
        if is_last and not self._measured:
            self._measured = True
            if self._started is not None:
                self._count(self._now() - self._started)

    def _timed(self, allreduce: Callable[[Any, Any], Any], state: Any, bucket: Any) -> Any:
        self.bucket_ready(bucket.is_last())
        return allreduce(state, bucket)

    def _count(self, seconds: float) -> None:
        if self._warmup > 0:
            self._warmup -= 1
            return
        total, steps = self._samples
        self._samples = (total + seconds, steps + 1)

    # -- the control thread ------------------------------------------------------------------
    def heartbeat_fields(self) -> dict[str, Any]:
        """The mean compute time of the steps since the last heartbeat (if any), and the sync
        entered last (with a hooked model)."""
        (total, steps), self._samples = self._samples, (0.0, 0)
        fields: dict[str, Any] = {}
        if steps:
            fields["compute_seconds"] = round(total / steps, 6)
        if self.sync_step is not None:
            fields["sync_step"] = self.sync_step
        return fields

    # -- wiring ------------------------------------------------------------------------------
    def hook(self, model: Any) -> bool:
        """Time a DistributedDataParallel model's gradient sync: a communication hook that
        notes the bucket, then runs DDP's own all-reduce (its results are DDP's default ones).
        False, and nothing changes, for any other model or one with a hook of its own."""
        if self.hooked or not _is_ddp(model):
            return False  # (FSDP's hooks take other arguments: not this one)
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        process_group = getattr(model, "process_group", None)
        try:
            # A lambda: DDP checks a hook's annotations against its own classes.
            model.register_comm_hook(
                process_group,
                lambda state, bucket: self._timed(allreduce_hook, state, bucket),
            )
        except Exception as error:  # a hook registered already: DDP takes one; training goes on
            logger.info("brakeline: gradient sync not timed (%s)", error)
            return False
        self.hooked = True
        return True


def _is_ddp(model: Any) -> bool:
    """A DistributedDataParallel (or a subclass), without importing torch for other models."""
    parallel = sys.modules.get("torch.nn.parallel")
    return parallel is not None and isinstance(model, parallel.DistributedDataParallel)
