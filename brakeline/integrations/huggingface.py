"""Hugging Face Trainer callback: ``Trainer(..., callbacks=[BrakelineCallback(run)])``.

Uses the Trainer's own hooks: ``on_step_end`` is the step boundary; ``control.should_save``
makes the Trainer write its own checkpoint folder for checkpoint_and_pause (restore with
``trainer.train(resume_from_checkpoint=...)``), confirmed and held in ``on_save``;
``control.should_training_stop`` is the graceful terminate. A NonFiniteCounter on the model
counts NaN losses the Trainer hides from its logs (``logging_nan_inf_filter``).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from transformers import TrainerCallback

import brakeline
from brakeline.checkpoint import CheckpointResult, sha256_of, size_of
from brakeline.commands import Command
from brakeline.handlers import ACK_LATER, PauseInfo
from brakeline.run import Run


@dataclasses.dataclass
class _PendingPause:
    command: Command
    step: int
    requested_at: float


class BrakelineCallback(TrainerCallback):
    """Streams the Trainer's logs, applies console commands at each optimizer step."""

    def __init__(self, run: Run | None = None, **init_kwargs: Any) -> None:
        self.owns_run = run is None
        self.run = run if run is not None else brakeline.init(**init_kwargs)
        self.terminate_requested = False
        self._pending_pause: _PendingPause | None = None

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        **kwargs: Any,
    ) -> None:
        self.run.watch(model=model, optimizer=optimizer, scheduler=lr_scheduler)
        self.run.on_command("checkpoint_and_pause", self._request_checkpoint_and_pause)
        self.run.set_terminate_handler(self._stop_gracefully)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        pending = self._pending_pause
        if pending is not None and state.global_step > pending.step:
            self._pause_without_checkpoint(pending, state.global_step)
        self.run.step_boundary(state.global_step)
        if self._pending_pause is not None:
            control.should_save = True  # the Trainer saves right after this hook, then on_save
        if self.terminate_requested:
            control.should_training_stop = True
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any
    ) -> None:
        numbers = {
            k: v
            for k, v in (logs or {}).items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if numbers:
            self.run.log(numbers, step=state.global_step)

    def on_prediction_step(self, *args: Any, **kwargs: Any) -> None:
        self.run.keepalive()  # evaluation is progress, not a hang

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        pending, self._pending_pause = self._pending_pause, None
        if pending is None:
            # Hashing the Trainer's folder happens in the snapshot thread, not here.
            self.run.send_snapshot("checkpoint", state.global_step, None, os.path.abspath(folder))
            return
        result = CheckpointResult(
            path=os.path.abspath(folder),
            bytes=size_of(folder),
            seconds=round(time.monotonic() - pending.requested_at, 6),
            sha256=sha256_of(folder),
            step=state.global_step,
        )
        self.run.last_checkpoint = result
        self.run.send_snapshot("checkpoint", state.global_step, None, result)
        info = PauseInfo(state.global_step, pending.command.id, pending.command.reason, result)
        self.run.ack(pending.command.id, "succeeded", result.as_dict())
        self.run.wait_for_ack(pending.command.id)
        self.run.call_hooks("release", info)
        self.run.hold_paused(state.global_step, info)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.terminate_requested:
            self.run.finish_terminated()
        elif self.owns_run:
            self.run.finish()

    def _request_checkpoint_and_pause(self, run: Run, command: Command, step: int) -> Any:
        if run.paused or self._pending_pause is not None:
            return {"step": step, "already_paused": True}
        run.set_status("checkpointing")
        run.pause_pending = True
        self._pending_pause = _PendingPause(command, step, time.monotonic())
        return ACK_LATER

    def _pause_without_checkpoint(self, pending: _PendingPause, step: int) -> None:
        """The Trainer skipped the save we asked for (e.g. save disabled on this rank): still
        pause, report the failure, keep the accelerators."""
        self._pending_pause = None
        self.run.ack(
            pending.command.id,
            "failed",
            {"step": step, "paused": True},
            "the Trainer did not save a checkpoint; training is paused without one",
        )
        self.run.hold_paused(
            step, PauseInfo(step, pending.command.id, pending.command.reason, None)
        )

    def _stop_gracefully(self, step: int) -> None:
        self.terminate_requested = True
