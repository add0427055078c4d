"""Lightning callback: ``Trainer(callbacks=[BrakelineCallback(run)])``.

Uses Lightning's own hooks: ``on_train_batch_end`` is the step boundary (once per optimizer
step: the micro-batches of an accumulated step are progress, not boundaries),
``trainer.should_stop`` is the graceful terminate, ``trainer.save_checkpoint`` is the
checkpoint_and_pause saver (restore with ``trainer.fit(model, loader, ckpt_path=...)``), and
``on_save_checkpoint``/``on_load_checkpoint`` carry every RNG state, the registered seeds and
the position in the epoch inside Lightning's own checkpoints.

An exact resume needs the rest of the epoch in the order the stopped run would have seen it.
Lightning restarts a mid-epoch checkpoint's epoch from a new iterator, and a shuffling
DataLoader draws its order from the process's RNG at that moment. Hand the loader a
:class:`ResumableSampler` (and the callback the same sampler): its order is a function of its
seed and the epoch, and after ``fit(ckpt_path=...)`` it starts at the sample after the last
batch the checkpoint's run trained on. The RNG states are put back when training starts, after
Lightning has built its data iterator, so the first resumed step draws what the stopped run
would have drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

import torch

import brakeline
from brakeline._rng import capture_rng_state, restore_rng_state
from brakeline._run import Run

CHECKPOINT_KEY = "brakeline"


def _loss_from(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs if hasattr(outputs, "detach") else None


def _finish_the_saved_epoch(checkpoint: dict) -> None:
    """A checkpoint written at an epoch's end (``on_train_epoch_end``, as ModelCheckpoint
    does) holds an epoch processed but not completed, and Lightning resumes it by running one
    more batch as the rest of that epoch. Its loop state is made what Lightning itself keeps
    when the checkpoint is written at the epoch's last batch end and that epoch is then over:
    the epoch completed, the per-epoch counters at zero. It resumes at the next epoch's first
    batch, as the run that wrote it went on."""
    loop = checkpoint.get("loops", {}).get("fit_loop", {})
    progress = loop.get("epoch_progress", {})
    current = progress.get("current", {})
    if not current or current.get("processed", 0) <= current.get("completed", 0):
        return
    for counts in (current, progress.get("total", {})):
        counts["completed"] = counts.get("processed", 0)
    for key in ("epoch_loop.batch_progress", "epoch_loop.scheduler_progress"):
        _zero(loop.get(key, {}).get("current", {}))
    batch = loop.get("epoch_loop.batch_progress", {})
    if "is_last_batch" in batch:
        batch["is_last_batch"] = False
    optimizer = loop.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer")
    for part in (optimizer or {}).values():
        _zero(part.get("current", {}) if isinstance(part, dict) else {})


def _zero(counts: dict) -> None:
    for key in counts:
        counts[key] = 0


def _draw_as_a_new_iterator(loader: Any) -> None:
    """The checkpoint ended its epoch: the stopped run then built the next epoch's iterator,
    which drew its base seed from the process's RNG. Lightning's resumed run built that
    iterator before the RNG was restored, so the draw is made again here."""
    if isinstance(loader, torch.utils.data.DataLoader) and loader.generator is None:
        torch.empty((), dtype=torch.int64).random_()


class ResumableSampler(torch.utils.data.Sampler[int]):
    """Indices of ``data_source`` in an order that depends only on ``seed`` and the epoch
    (Lightning calls ``set_epoch``), resumable at any sample of an epoch."""

    def __init__(self, data_source: Any, *, shuffle: bool = True, seed: int = 0) -> None:
        self.size = len(data_source)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._start = 0  # where the next iteration begins (a resumed epoch)

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self._start = epoch, 0

    def resume_at(self, epoch: int, samples_done: int) -> None:
        """Begin at sample ``samples_done`` of ``epoch`` (the next epoch if it was all done)."""
        if samples_done >= self.size:
            epoch, samples_done = epoch + 1, 0
        self.epoch, self._start = epoch, samples_done

    def __iter__(self) -> Any:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.size, generator=generator).tolist()
        else:
            order = list(range(self.size))
        start, self._start = self._start, 0
        return iter(order[start:])

    def __len__(self) -> int:
        return self.size


class BrakelineCallback(Callback):
    """Streams loss and learning rate, applies console commands at each batch end."""

    def __init__(
        self,
        run: Run | None = None,
        *,
        log_every_n_steps: int = 1,
        sampler: ResumableSampler | None = None,
        **init_kwargs: Any,
    ):
        super().__init__()
        self.sampler = sampler
        self._batches_in_epoch = 0  # batches trained on in the current epoch
        self._rng_to_restore: Any = None
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
        self._boundary_step = trainer.global_step
        self.run.framework.resumed_at(trainer.global_step)
        if self._rng_to_restore is not None:  # after Lightning built its data iterator
            restore_rng_state(self._rng_to_restore)
            self._rng_to_restore = None
            if self._batches_in_epoch >= trainer.num_training_batches:
                _draw_as_a_new_iterator(trainer.train_dataloader)
                self._batches_in_epoch = 0

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._batches_in_epoch = 0

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._batches_in_epoch += 1
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
        batch_size = getattr(trainer.train_dataloader, "batch_size", None)
        checkpoint[CHECKPOINT_KEY] = {
            "rng": capture_rng_state(),
            "seeds": dict(self.run.training.seeds),
            "epoch": trainer.current_epoch,
            "batches_in_epoch": self._batches_in_epoch,
            "batch_size": batch_size,
        }

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
        _finish_the_saved_epoch(checkpoint)
        saved = checkpoint.get(CHECKPOINT_KEY)
        if not saved:
            return
        self._rng_to_restore = saved["rng"]
        self.run.training.seeds.update(saved.get("seeds") or {})
        self._batches_in_epoch = saved.get("batches_in_epoch", 0)
        if self.sampler is not None and saved.get("batch_size"):
            done = saved["batches_in_epoch"] * saved["batch_size"]
            self.sampler.resume_at(saved["epoch"], done)

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
