"""Checkpoints that can be trusted: atomic, durable, hashed, and restorable bit for bit.

A save writes to a temporary name in the destination folder, fsyncs the data, renames it over
the final name with ``os.replace`` (atomic on POSIX) and fsyncs the folder so the rename itself
survives a crash. Readers therefore see the old checkpoint or the new one, never half of one.
torch is imported only when a default torch checkpoint is written or read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from brakeline._rng import capture_rng_state, restore_rng_state

FORMAT = "brakeline-checkpoint/1"
# A saver writes a complete checkpoint at the given (temporary) path; brakeline does the rest.
Saver = Callable[[Path, int], None]


@dataclasses.dataclass
class CheckpointResult:
    """What the acknowledgement of a checkpoint reports."""

    path: str
    bytes: int
    seconds: float
    sha256: str
    step: int
    # The last step whose optimizer update the weights hold (the step guard knows it): below
    # ``step`` when the update of a non-finite step was skipped. None: not known.
    weights_step: int | None = None
    # Why it was taken: "brake" (checkpoint_and_pause), "manual" (run.checkpoint), ...
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {key: value for key, value in dataclasses.asdict(self).items() if value is not None}


@dataclasses.dataclass
class RestoredState:
    """What :func:`restore` found: the step to continue after and the data position."""

    step: int
    data_position: dict[str, Any] | None
    seeds: dict[str, Any]

    @property
    def epoch(self) -> int:
        return int((self.data_position or {}).get("epoch", 0))


def _as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def sha256_of(path: str | Path) -> str:
    """SHA-256 of a file; of a folder, over its files' relative names and contents, sorted."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as handle:
            while chunk := handle.read(1024 * 1024):
                digest.update(chunk)
    return digest.hexdigest()


def size_of(path: str | Path) -> int:
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(path: Path) -> None:
    if path.is_dir():
        for item in sorted(path.rglob("*"), reverse=True):
            _fsync(item)
    _fsync(path)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def save_atomically(final_path: str | Path, step: int, saver: Saver) -> CheckpointResult:
    """Run ``saver`` on a temporary path beside ``final_path``, make it durable, rename it."""
    started = time.monotonic()
    final_path = Path(final_path)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    temporary = final_path.with_name(f".{final_path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}")
    try:
        saver(temporary, step)
        if not temporary.exists():
            raise FileNotFoundError(f"the saver wrote nothing at {temporary}")
        _fsync_tree(temporary)
        if final_path.is_dir():
            shutil.rmtree(final_path)  # os.replace cannot replace a non-empty folder
        os.replace(temporary, final_path)
        _fsync(final_path.parent)
    except BaseException:
        _remove(temporary)
        raise
    seconds = time.monotonic() - started
    return CheckpointResult(
        path=str(final_path.resolve()),
        bytes=size_of(final_path),
        seconds=round(seconds, 6),
        sha256=sha256_of(final_path),
        step=step,
    )


@dataclasses.dataclass
class TrainingObjects:
    """What the default saver saves and :func:`restore` restores (registered by run.watch)."""

    models: list[Any] = dataclasses.field(default_factory=list)
    optimizers: list[Any] = dataclasses.field(default_factory=list)
    schedulers: list[Any] = dataclasses.field(default_factory=list)
    # Anything else with state_dict()/load_state_dict(): a GradScaler, an EMA, a sampler...
    stateful: dict[str, Any] = dataclasses.field(default_factory=dict)
    loader: Any = None
    seeds: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.models or self.optimizers or self.schedulers or self.stateful)

    def state(self, step: int) -> dict[str, Any]:
        """The complete training state at a step boundary, ready for torch.save."""
        return {
            "format": FORMAT,
            "step": step,
            "models": [model.state_dict() for model in self.models],
            "optimizers": [optimizer.state_dict() for optimizer in self.optimizers],
            "schedulers": [scheduler.state_dict() for scheduler in self.schedulers],
            "stateful": {name: obj.state_dict() for name, obj in self.stateful.items()},
            "data_position": self.loader.state_dict() if self.loader is not None else None,
            "rng": capture_rng_state(),
            "seeds": dict(self.seeds),
        }

    def torch_saver(self, path: Path, step: int) -> None:
        """The default saver: one torch.save file with everything in :meth:`state`."""
        import torch

        torch.save(self.state(step), path)


def checkpoint_path(directory: str | Path, step: int, rank: int = 0, suffix: str = ".pt") -> Path:
    """``step-00000120.pt`` for rank 0, ``step-00000120.rank-3.pt`` for rank 3."""
    name = f"step-{step:08d}{suffix}" if rank == 0 else f"step-{step:08d}.rank-{rank}{suffix}"
    return Path(directory) / name


def latest_checkpoint(directory: str | Path, rank: int = 0, suffix: str = ".pt") -> Path | None:
    """The checkpoint with the highest step in ``directory`` for this rank, or None."""
    suffix = suffix if rank == 0 else f".rank-{rank}{suffix}"
    steps = {
        path: path.name[len("step-") : -len(suffix)]
        for path in Path(directory).glob("step-*" + suffix)
    }
    found = {path: int(step) for path, step in steps.items() if step.isdigit()}
    return max(found, key=found.__getitem__, default=None)


def _load_each(targets: Sequence[Any], states: Sequence[Any], what: str) -> None:
    if len(targets) > len(states):
        raise ValueError(f"checkpoint holds {len(states)} {what}, {len(targets)} given")
    for target, state in zip(targets, states, strict=False):
        target.load_state_dict(state)


def restore(
    path: str | Path,
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    loader: Any = None,
    stateful: Mapping[str, Any] | None = None,
    map_location: Any = "cpu",
    expected_sha256: str | None = None,
) -> RestoredState:
    """Restore a default brakeline checkpoint into fresh objects, including every RNG.

    ``model``/``optimizer``/``scheduler`` may each be one object or a list. With a
    :class:`~brakeline._loader.PausableLoader`, its next ``for`` loop resumes at the saved batch
    and the RNG is restored after that fast-forward; without one, the RNG is restored at once.
    """
    if expected_sha256 is not None and sha256_of(path) != expected_sha256:
        raise ValueError(f"checkpoint {path} does not match the expected sha256")
    import torch

    state = torch.load(path, map_location=map_location, weights_only=True)
    if state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a brakeline checkpoint (format {state.get('format')!r})")
    _load_each(_as_list(model), state["models"], "models")
    _load_each(_as_list(optimizer), state["optimizers"], "optimizers")
    _load_each(_as_list(scheduler), state["schedulers"], "schedulers")
    for name, obj in (stateful or {}).items():
        obj.load_state_dict(state["stateful"][name])
    position = state.get("data_position")
    if loader is not None and position is not None:
        loader.load_state_dict(position, rng_after=state["rng"])
    else:
        restore_rng_state(state["rng"])
    return RestoredState(
        step=int(state["step"]),
        data_position=position,
        seeds=dict(state.get("seeds") or {}),
    )
