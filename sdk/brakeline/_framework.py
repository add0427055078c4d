"""What a framework's integration (``brakeline.integrations``) asks of the run: ``run.framework``.

A framework such as Lightning or the Hugging Face Trainer drives the training loop itself, so
it knows two things the run cannot see: where training resumed after the framework restored
one of its own checkpoints, and — the Trainer — the checkpoint folder it writes when told to
save. An integration reports both here; everything else goes through the run's public calls
(``watch``, ``log``, ``step_boundary``, ``set_saver``, ``set_terminate_handler``...).

A brake (``checkpoint_and_pause``) whose checkpoint the framework writes runs in three hooks:
the command's handler asks for the save (:meth:`FrameworkRun.request_save`), the framework's
step-end hook sees :attr:`FrameworkRun.save_request` and tells the framework to save, and its
save hook hands the written folder over (:meth:`FrameworkRun.checkpoint_and_pause` with
:meth:`FrameworkRun.checkpoint_written`), or reports that no save came
(:meth:`FrameworkRun.save_skipped`). The pause controller (brakeline._pause) then confirms,
releases and holds, as for a checkpoint the SDK writes itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from brakeline._checkpoint import CheckpointResult, sha256_of, size_of
from brakeline._commands import ACK_LATER, Command
from brakeline._guard import StepGuard
from brakeline._pause import PauseController, SaveRequest
from brakeline._state import RunState


class FrameworkRun:
    """The run as a framework's integration drives it. Training thread only."""

    def __init__(self, state: RunState, guard: StepGuard, pause: PauseController) -> None:
        self._state = state
        self._guard = guard
        self._pause = pause

    def resumed_at(self, step: int) -> None:
        """The framework restored its checkpoint of ``step`` (or starts at 0): the steps go on
        from it, and the step guard takes the weights to hold every update up to it."""
        self._state.step = step
        self._guard.resumed_at(step)

    # -- a brake whose checkpoint the framework writes -------------------------------------------
    @property
    def save_request(self) -> SaveRequest | None:
        """The brake waiting for the framework's save (None when there is none)."""
        return self._pause.save_request

    def request_save(self, command: Command, step: int) -> Any:
        """For a ``checkpoint_and_pause`` handler: ask the framework's next save hook for the
        checkpoint. Returns what the handler returns: ``ACK_LATER`` (the hand-over
        acknowledges), or the result to acknowledge when a pause is already under way."""
        refusal = self._pause.refusal(step)
        if refusal is not None:
            return refusal
        self._pause.request_save(command, step)
        return ACK_LATER

    def checkpoint_and_pause(
        self, request: SaveRequest, step: int, hand_over: Callable[[], CheckpointResult]
    ) -> None:
        """The framework has saved for ``request``: ``hand_over`` describes its checkpoint
        (see :meth:`checkpoint_written`); then confirm, release and hold (returns when the
        pause ends). If ``hand_over`` raises, the run holds without a checkpoint."""
        self._pause.checkpoint_and_pause(request.command, step, hand_over)

    def save_skipped(self, step: int, error: str) -> None:
        """The framework went past the requested save without writing it: the run still
        pauses, reports ``error`` and keeps its accelerators."""
        self._pause.abandon_save(step, error)

    def checkpoint_written(
        self, path: str, step: int, request: SaveRequest, reason: str = "brake"
    ) -> CheckpointResult:
        """The checkpoint the framework wrote at ``path`` for ``request``, hashed and labelled
        with the updates its weights hold (device flags still pending are read first, so the
        label is true) and what re-running a refused step found (brakeline._attribute)."""
        guard = self._guard
        guard.settle()
        return CheckpointResult(
            path=path,
            bytes=size_of(path),
            seconds=round(time.monotonic() - request.requested_at, 6),
            sha256=sha256_of(path),
            step=step,
            # The console marks a checkpoint clean by it.
            weights_step=guard.weights_step if guard.enabled else None,
            reason=reason,
            rerun=guard.rerun.take_report(),
        )
