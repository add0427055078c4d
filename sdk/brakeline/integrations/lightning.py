"""Lightning callback: ``Trainer(callbacks=[BrakelineCallback(run)])``.

Uses Lightning's own hooks: ``on_train_batch_end`` is the step boundary, ``trainer.should_stop``
is the graceful terminate, ``trainer.save_checkpoint`` is the checkpoint_and_pause saver (restore
with ``trainer.fit(model, ckpt_path=...)``), and ``on_save_checkpoint``/``on_load_checkpoint``
carry every RNG state and the registered seeds inside Lightning's own checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]

import brakeline
from brakeline._rng import capture_rng_state, restore_rng_state
from brakeline._run import Run

CHECKPOINT_KEY = "brakeline"


def _loss_from(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs if hasattr(outputs, "detach") else None


class BrakelineCallback(Callback):
    """Streams loss and learning rate, applies console commands at each batch end."""

    def __init__(self, run: Run | None = None, *, log_every_n_steps: int = 1, **init_kwargs: Any):
        super().__init__()
        # A run we created is ours to finish at the end of fit; a given one belongs to the user.
        self.owns_run = run is None
        self.run = run if run is not None else brakeline.init(**init_kwargs)
        self.log_every_n_steps = max(1, log_every_n_steps)
        self.terminate_requested = False
        self._trainer: Any = None
        self._saving_for_brakeline = False
        self._boundary_step: int | None = None  # the global step of the last boundary

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._trainer = trainer
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        self.run.watch(model=pl_module, optimizer=list(trainer.optimizers), scheduler=schedulers)
        self.run.set_saver(self._save_with_trainer, suffix=".ckpt")
        self.run.set_terminate_handler(self._stop_gracefully)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # After Lightning restored a checkpoint (fit(ckpt_path=...)): the steps go on from its
        # step, and the weights hold every update up to it.
        self.run.step = self._boundary_step = trainer.global_step
        self.run._guard.resumed_at(trainer.global_step)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._boundary_step:
            # A micro-batch of an accumulated step (no optimizer step yet): progress, but no
            # boundary, or a command would apply between the micro-batches of one step.
            self.run.keepalive()
            return
        self._boundary_step = step
        if step % self.log_every_n_steps == 0:
            metrics: dict[str, Any] = {}
            loss = _loss_from(outputs)
            if loss is not None:
                metrics["loss"] = loss
            if trainer.optimizers:
                metrics["lr"] = float(trainer.optimizers[0].param_groups[0]["lr"])
            self.run.log(metrics, step=step)
        self.run.step_boundary(step)

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        self.run.keepalive()  # validation is progress, not a hang

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "rng": capture_rng_state(),
            "seeds": dict(self.run.training.seeds),
        }

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        saved = checkpoint.get(CHECKPOINT_KEY)
        if saved:
            restore_rng_state(saved["rng"])
            self.run.training.seeds.update(saved.get("seeds") or {})

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.terminate_requested:
            self.run.finish_terminated()
        elif self.owns_run:
            self.run.finish()

    def _save_with_trainer(self, path: Path, step: int) -> None:
        # A full checkpoint (optimizer, schedulers, loops): what an exact resume needs.
        self._trainer.save_checkpoint(str(path), weights_only=False)

    def _stop_gracefully(self, step: int) -> None:
        self.terminate_requested = True
        self._trainer.should_stop = True
