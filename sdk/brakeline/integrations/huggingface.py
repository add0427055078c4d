"""Hugging Face Trainer callback: ``Trainer(..., callbacks=[BrakelineCallback(run)])``.

Uses the Trainer's own hooks: ``on_step_end`` is the step boundary; ``control.should_save``
makes the Trainer write its own checkpoint folder for checkpoint_and_pause (restore with
``trainer.train(resume_from_checkpoint=...)``), confirmed and held in ``on_save``;
``control.should_training_stop`` is the graceful terminate. A NonFiniteCounter on the model
counts NaN losses the Trainer hides from its logs (``logging_nan_inf_filter``).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

import brakeline
from brakeline._checkpoint import CheckpointResult
from brakeline._commands import Command
from brakeline._pause import SaveRequest
from brakeline._run import Run


class BrakelineCallback(TrainerCallback):
    """Streams the Trainer's logs, applies console commands at each optimizer step."""

    def __init__(self, run: Run | None = None, **init_kwargs: Any) -> None:
        self.owns_run = run is None
        self.run = run if run is not None else brakeline.init(**init_kwargs)
        self.terminate_requested = False

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
        # After resume_from_checkpoint: the steps go on from the restored one, whose updates
        # the weights hold.
        self.run.framework.resumed_at(state.global_step)
        self.run.on_command("checkpoint_and_pause", self._request_checkpoint_and_pause)
        self.run.set_terminate_handler(self._stop_gracefully)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        framework = self.run.framework
        request = framework.save_request
        if request is not None and state.global_step > request.step:
            # The Trainer skipped the save we asked for (e.g. save disabled on this rank).
            framework.save_skipped(
                state.global_step,
                "the Trainer did not save a checkpoint; training is paused without one",
            )
        self.run.step_boundary(state.global_step)
        if framework.save_request is not None:
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

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        folder = os.path.abspath(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))
        request = self.run.framework.save_request
        if request is None:
            # Hashing the Trainer's folder happens in the snapshot thread, not here.
            self.run.send_snapshot("checkpoint", state.global_step, None, folder)
            return control
        # The Trainer has written its folder: the pause controller hashes, confirms, releases
        # and holds, as for a checkpoint the SDK writes itself.
        self.run.framework.checkpoint_and_pause(
            request, state.global_step, lambda: self._hand_over(request, folder, state)
        )
        if self.terminate_requested:  # terminated during the hold: not one more step
            control.should_training_stop = True
        return control

    def _hand_over(self, request: SaveRequest, folder: str, state: Any) -> CheckpointResult:
        result = self.run.framework.checkpoint_written(folder, state.global_step, request)
        self.run.last_checkpoint = result
        self.run.send_snapshot("checkpoint", state.global_step, None, result)
        return result

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.terminate_requested:
            self.run.finish_terminated()
        elif self.owns_run:
            self.run.finish()

    def _request_checkpoint_and_pause(self, run: Run, command: Command, step: int) -> Any:
        return run.framework.request_save(command, step)  # the Trainer saves after this step

    def _stop_gracefully(self, step: int) -> None:
        self.terminate_requested = True
