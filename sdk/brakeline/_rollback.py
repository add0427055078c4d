"""Checkpoints and roll back: what ``run.checkpoint`` and ``run.roll_back`` do.

Everything here runs in the training thread, between steps: saving, restoring in place while
held, dropping the batches of the steps a roll back skips, and reporting each checkpoint to the
console's catalogue (queued for the control thread).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from brakeline._checkpoint import (
    CheckpointResult,
    IncompleteCheckpointSet,
    Saver,
    TrainingObjects,
    checkpoint_path,
    gather_set,
    restore,
    save_atomically,
    sha256_of,
    shard_to_restore,
    size_of,
)
from brakeline._commands import CommandFailed
from brakeline._encoding import to_jsonable
from brakeline._guard import StepGuard
from brakeline._link import Outbox
from brakeline._pace import StepPace
from brakeline._settings import Settings
from brakeline._state import RunState
from brakeline._transport import encode_json

logger = logging.getLogger("brakeline")


class Checkpoints:
    """Saves checkpoints of the watched objects (or with your saver), rolls back to one in
    place, and drops the batches of the steps a roll back skips (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        state: RunState,
        training: TrainingObjects,
        guard: StepGuard,
        pace: StepPace,
        outbox: Outbox,
        set_status: Callable[[str], None],
    ) -> None:
        self._settings = settings
        self._state = state
        self._training = training
        self._guard = guard
        self._pace = pace
        self._outbox = outbox
        self._set_status = set_status  # heartbeats say "checkpointing" during a save
        self.saver: Saver | None = None  # your own (set_saver), else the default torch saver
        self.suffix = ".pt"
        self.last: CheckpointResult | None = None
        self.skip_steps: set[int] = set()
        # The checkpoint whose state the run holds right now (just saved, or just restored),
        # with the run's step and the guard's label then: a save at that same state keeps it.
        self._held: tuple[CheckpointResult, int, int | None] | None = None

    def set_saver(self, saver: Saver, suffix: str = ".pt") -> None:
        self.saver = saver
        self.suffix = suffix

    def save(self, step: int, reason: str) -> CheckpointResult:
        """Save now (training thread, between steps): atomic, fsynced, hashed, labelled with
        the updates its weights hold, and reported to the console's catalogue."""
        saver = self.saver
        if saver is None and not self._training.empty:
            saver = self._training.torch_saver
        if saver is None:
            raise RuntimeError(
                "nothing to checkpoint: call run.watch(model=..., optimizer=...) "
                "or run.set_saver(...)"
            )
        settings = self._settings
        path = checkpoint_path(settings.checkpoint_dir, step, settings.rank, self.suffix)
        kept = self._still_held(path, step, reason)
        if kept is not None:
            return kept
        previous_status = self._state.status
        self._pace.skip_step()  # a save is not the step's own work
        # Heartbeats say "checkpointing" during a long save, so it is not taken for a hang.
        self._set_status("checkpointing")
        try:
            result = save_atomically(path, step, saver)
        finally:
            self._set_status(previous_status)
        result.reason = reason
        # Which updates the saved weights hold, as far as the guard of the watched optimizers
        # knows (the console marks the checkpoint clean or "after the anomaly" by it).
        self._guard.settle()  # device flags still pending are read: the label must be true
        result.weights_step = self._guard.weights_step
        if reason == "brake":  # the brake's acknowledgement says what the re-run found
            result.rerun = self._guard.rerun.take_report()
        if settings.checkpoint_sets:  # collective: rank 0 writes the set's manifest
            found = gather_set(result, settings.checkpoint_dir)
            result.set = found.as_report() if found is not None else None
        self.last = result
        self._held = (result, self._state.step, result.weights_step)
        self._report(result)
        return result

    def _still_held(self, path: Path, step: int, reason: str) -> CheckpointResult | None:
        """The checkpoint already at ``path`` when the run holds exactly its state: nothing
        trained since it was saved or restored (a loop's periodic save right after a brake, or
        after a roll back to that very step). Writing it again would replace a catalogued file
        with other bytes (the RNG and the loader moved on): its hash would no longer match, and
        the clean state the console would roll back to would be gone. A brake always saves."""
        if self._held is None or reason == "brake" or not path.exists():
            return None
        result, run_step, weights_step = self._held
        same = (result.path, result.step) == (str(path.resolve()), step)
        if not same or (run_step, weights_step) != (self._state.step, self._guard.weights_step):
            return None
        logger.info("brakeline: %s already holds step %d's state: kept as it is", path, step)
        return result

    def roll_back(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``run.roll_back``: restore the named checkpoint in place (training thread, while
        held), after checking it is ours and intact; CommandFailed (the run stays paused)
        otherwise. The batches of ``skip_steps`` after it are dropped when fetched."""
        path, expected, skip = _roll_back_params(params)
        try:  # a set: this rank's shard, once the manifest and every shard check out
            path, expected = shard_to_restore(params, self._settings.rank) or (path, expected)
        except IncompleteCheckpointSet as error:
            raise CommandFailed(str(error), {"rank": error.rank}) from None
        if self.saver is not None or self._training.empty:
            raise CommandFailed(
                "roll back in place restores the SDK's default checkpoints of watched objects; "
                "with your own saver, restore in a resume handler (run.on_command('resume', "
                "...)) that returns {'rolled_back': True, 'restored_step': ..., 'sha256': ...}"
            )
        actual = _verified_sha256(path, expected)
        step = self._restore(path)
        self._state.step = step
        self._guard.weights_step = step
        self.skip_steps = {s for s in skip if s > step}
        restored = CheckpointResult(
            path=str(Path(path).resolve()),
            bytes=size_of(path),
            seconds=0.0,
            sha256=actual,
            step=step,
            reason="restored",
        )
        self._held = (restored, step, step)
        logger.warning("brakeline: rolled back to %s (step %d)", path, step)
        return {
            "rolled_back": True,
            "restored_step": step,
            "path": str(path),
            "sha256": actual,
            "skip_steps": sorted(self.skip_steps),
        }

    def _restore(self, path: Path) -> int:
        training = self._training
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
        return state.step

    def skip_batch(self) -> bool:
        """A wrapped loader asks before yielding: is the next step's batch one to drop?"""
        state = self._state
        if not self.skip_steps or (state.step + 1) not in self.skip_steps:
            return False
        self.skip_steps.discard(state.step + 1)
        state.step += 1  # that step happens without training: no update, no log
        logger.warning("brakeline: skipped the batch of step %d (roll back)", state.step)
        return True

    def _report(self, result: CheckpointResult) -> None:
        # The console's catalogue: what a roll back may name, marked clean or not by it.
        body = {
            key: value
            for key, value in result.as_dict().items()
            if key in ("path", "sha256", "step", "bytes", "reason", "weights_step", "set")
        }
        body["rank"] = self._settings.rank
        self._outbox.enqueue(
            f"checkpoint:{result.sha256}", "checkpoints", encode_json(to_jsonable(body))
        )


def _verified_sha256(path: Path, expected: str | None) -> str:
    try:
        actual = sha256_of(path)
    except OSError as error:
        raise CommandFailed(f"checkpoint {path} cannot be read: {error}") from None
    if expected is not None and actual != expected:
        raise CommandFailed(f"checkpoint {path} has sha256 {actual}, not {expected}")
    return actual


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
