"""Checkpoints and roll back, as methods of the Run (a mixin, so ``run.checkpoint`` and
``run.roll_back`` stay where users and handlers call them).

Everything here runs in the training thread, between steps: saving, restoring in place while
held, dropping the batches of the steps a roll back skips, and reporting each checkpoint to the
console's catalogue (queued for the control thread).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from brakeline._checkpoint import (
    CheckpointResult,
    IncompleteCheckpointSet,
    checkpoint_path,
    gather_set,
    restore,
    save_atomically,
    sha256_of,
    shard_to_restore,
)
from brakeline._commands import CommandFailed
from brakeline._encoding import to_jsonable
from brakeline._transport import encode_json

logger = logging.getLogger("brakeline")


class CheckpointMixin:
    """The Run's checkpoint, roll back and skipped-batch methods (see :class:`brakeline.Run`)."""

    # Attributes of the Run these methods use (set in Run.__init__).
    settings: Any
    step: int
    status: str
    training: Any
    control: Any
    last_checkpoint: CheckpointResult | None
    _saver: Any
    _saver_suffix: str
    _guard: Any
    _skip_steps: set[int]
    _pace: Any

    def checkpoint(self, step: int | None = None, reason: str = "manual") -> CheckpointResult:
        """Save a checkpoint now (training thread, between steps) with the registered saver or
        the default torch saver; atomic, fsynced, hashed. Also sends a checkpoint snapshot."""
        step = self.step if step is None else step
        saver = self._saver
        if saver is None and not self.training.empty:
            saver = self.training.torch_saver
        if saver is None:
            raise RuntimeError(
                "nothing to checkpoint: call run.watch(model=..., optimizer=...) "
                "or run.set_saver(...)"
            )
        path = checkpoint_path(
            self.settings.checkpoint_dir, step, self.settings.rank, self._saver_suffix
        )
        previous_status = self.status
        self._pace.skip_step()  # a save is not the step's own work
        # Heartbeats say "checkpointing" during a long save, so it is not taken for a hang.
        self.set_status("checkpointing")
        try:
            result = save_atomically(path, step, saver)
        finally:
            self.set_status(previous_status)
        result.reason = reason
        # Which updates the saved weights hold, as far as the guard of the watched optimizers
        # knows (the console marks the checkpoint clean or "after the anomaly" by it).
        self._guard.settle()  # device flags still pending are read: the label must be true
        result.weights_step = self._guard.weights_step
        if self.settings.checkpoint_sets:  # collective: rank 0 writes the set's manifest
            found = gather_set(result, self.settings.checkpoint_dir)
            result.set = found.as_report() if found is not None else None
        self.last_checkpoint = result
        self._report_checkpoint(result)
        loader = self.training.loader
        self.send_snapshot("checkpoint", step, loader.position() if loader else None, result)
        return result

    def roll_back(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Restore the named checkpoint into the watched objects, in place (training thread,
        while held): model, optimizer, scheduler, stateful objects, the wrapped loader's
        position and every RNG; then ``run.step`` is the checkpoint's step. Raises
        CommandFailed (the run stays paused) when the checkpoint is not there, not ours, or
        does not match ``sha256``. ``skip_steps``: the batches of these later steps are
        fetched and dropped (the poisoned batch is not trained on again)."""
        path, expected, skip = _roll_back_params(params)
        try:  # a set: this rank's shard, once the manifest and every shard check out
            path, expected = shard_to_restore(params, self.settings.rank) or (path, expected)
        except IncompleteCheckpointSet as error:
            raise CommandFailed(str(error), {"rank": error.rank}) from None
        if self._saver is not None or self.training.empty:
            raise CommandFailed(
                "roll back in place restores the SDK's default checkpoints of watched objects; "
                "with your own saver, restore in a resume handler (run.on_command('resume', "
                "...)) that returns {'rolled_back': True, 'restored_step': ..., 'sha256': ...}"
            )
        try:
            actual = sha256_of(path)
        except OSError as error:
            raise CommandFailed(f"checkpoint {path} cannot be read: {error}") from None
        if expected is not None and actual != expected:
            raise CommandFailed(f"checkpoint {path} has sha256 {actual}, not {expected}")
        training = self.training
        try:
            state = restore(
                path,
                model=training.models,
                optimizer=training.optimizers,
                scheduler=training.schedulers,
                loader=training.loader,
                stateful=training.stateful,
            )
        except Exception as error:
            why = f"{type(error).__name__}: {error}"
            raise CommandFailed(f"restoring {path} failed: {why}") from None
        self.step = state.step
        self._guard.weights_step = state.step
        self._skip_steps = {s for s in skip if s > state.step}
        logger.warning("brakeline: rolled back to %s (step %d)", path, state.step)
        return {
            "rolled_back": True,
            "restored_step": state.step,
            "path": str(path),
            "sha256": actual,
            "skip_steps": sorted(self._skip_steps),
        }

    def _skip_batch(self) -> bool:
        """A wrapped loader asks before yielding: is the next step's batch one to drop?"""
        if not self._skip_steps or (self.step + 1) not in self._skip_steps:
            return False
        self._skip_steps.discard(self.step + 1)
        self.step += 1  # that step happens without training: no update, no log
        logger.warning("brakeline: skipped the batch of step %d (roll back)", self.step)
        return True

    def _report_checkpoint(self, result: CheckpointResult) -> None:
        # The console's catalogue: what a roll back may name, marked clean or not by it.
        if self.control is None:
            return
        body = {
            key: value
            for key, value in result.as_dict().items()
            if key in ("path", "sha256", "step", "bytes", "reason", "weights_step", "set")
        }
        body["rank"] = self.settings.rank
        encoded = encode_json(to_jsonable(body))
        self.control.enqueue(f"checkpoint:{result.sha256}", "checkpoints", lambda: encoded)


def _roll_back_params(params: Mapping[str, Any]) -> tuple[Path, str | None, list[int]]:
    path, expected, skip = params.get("checkpoint"), params.get("sha256"), params.get("skip_steps")
    if not isinstance(path, str) or not path:
        raise CommandFailed("roll back needs params.checkpoint, the checkpoint's path")
    if expected is not None and not isinstance(expected, str):
        raise CommandFailed("params.sha256 must be the checkpoint's hex SHA-256")
    skip = [] if skip is None else skip
    if not isinstance(skip, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in skip
    ):
        raise CommandFailed("params.skip_steps must be a list of step numbers")
    return Path(path), expected, skip
