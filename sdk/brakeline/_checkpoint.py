"""Checkpoints that can be trusted: atomic, durable, hashed, and restorable bit for bit.

A save writes to a temporary name in the destination folder, fsyncs the data, renames it over
the final name with ``os.replace`` (atomic on POSIX) and fsyncs the folder so the rename itself
survives a crash. Readers therefore see the old checkpoint or the new one, never half of one.
torch is imported only when a default torch checkpoint is written or read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from brakeline._rng import capture_rng_state, restore_rng_state

logger = logging.getLogger("brakeline")

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
    # The set it belongs to (multi-rank runs): CheckpointSet.as_report() once rank 0 wrote the
    # manifest; None for a lone process or when the set could not be completed.
    set: dict[str, Any] | None = None
    # A brake's checkpoint: what re-running the refused step found (brakeline._attribute),
    # {"step", "attribution"}; None when nothing was re-run since the last brake.
    rerun: dict[str, Any] | None = None

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


# A temporary name says whose it is: ``.step-00000120.pt.tmp-<host>-<pid>-<32 hex>``. Names
# of earlier SDKs had no host (``.tmp-<pid>-<32 hex>``).
_TEMPORARY = re.compile(r"^\..+\.tmp-(?:(?P<host>.+)-)?(?P<pid>\d+)-[0-9a-f]{32}$")
# A temporary file of an earlier SDK names no host: on a folder shared by several nodes its pid
# may be alive elsewhere, so only one this old is taken for a dead writer's.
HOSTLESS_TEMPORARY_AGE_SECONDS = 3600.0


def _host() -> str:
    return socket.gethostname().replace("/", "_") or "localhost"


def temporary_path(final_path: Path) -> Path:
    return final_path.with_name(
        f".{final_path.name}.tmp-{_host()}-{os.getpid()}-{uuid.uuid4().hex}"
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # somebody else's process: alive
    return True


def _abandoned(path: Path, now: float) -> bool:
    """A temporary file (or folder) whose writer died mid-save: one of this host whose pid is
    gone, or a host-less one of an earlier SDK that is also old."""
    found = _TEMPORARY.match(path.name)
    if found is None:
        return False
    pid, host = int(found["pid"]), found["host"]
    if host is not None and host != _host():
        return False  # its pid says nothing about a process of this host
    if pid == os.getpid() or _pid_alive(pid):
        return False
    if host is None:
        try:
            return now - path.lstat().st_mtime > HOSTLESS_TEMPORARY_AGE_SECONDS
        except OSError:
            return False
    return True


def remove_abandoned_temporaries(directory: str | Path) -> list[Path]:
    """Delete what saves killed midway left in ``directory`` (their temporary files: a torch
    shard can be gigabytes); files of live writers, or of other hosts, stay. Returns them."""
    now, removed = time.time(), []
    try:
        candidates = [p for p in Path(directory).iterdir() if ".tmp-" in p.name]
    except OSError:
        return []
    for path in candidates:
        if _abandoned(path, now):
            _remove(path)
            removed.append(path)
    if removed:
        logger.warning(
            "brakeline: removed %d temporary file(s) of saves killed midway in %s: %s",
            len(removed),
            directory,
            ", ".join(p.name for p in removed[:8]),
        )
    return removed


def save_atomically(final_path: str | Path, step: int, saver: Saver) -> CheckpointResult:
    """Run ``saver`` on a temporary path beside ``final_path``, make it durable, rename it.
    What earlier saves killed midway left in that folder is removed first."""
    started = time.monotonic()
    final_path = Path(final_path)
    final_path.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_temporaries(final_path.parent)
    temporary = temporary_path(final_path)
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


def latest_checkpoint(
    directory: str | Path, rank: int = 0, suffix: str = ".pt", world_size: int | None = None
) -> Path | None:
    """The checkpoint with the highest step in ``directory`` for this rank, or None.

    In a multi-rank run (``world_size`` above 1, by default from WORLD_SIZE) or a folder holding
    manifests, only complete checkpoint sets count: this rank's file of the newest set whose
    every shard is there with its size and whose own shard matches its SHA-256. Ranks resume at
    one step, never at their own latest files."""
    if world_size is None:
        value = os.environ.get("WORLD_SIZE", "")
        world_size = int(value) if value.isdigit() else 1
    if world_size > 1 or any(Path(directory).glob("step-*" + MANIFEST_SUFFIX)):
        found = latest_set(directory, rank)
        return Path(found.shard(rank)["path"]) if found is not None else None
    suffix = suffix if rank == 0 else f".rank-{rank}{suffix}"
    steps = {
        path: path.name[len("step-") : -len(suffix)]
        for path in Path(directory).glob("step-*" + suffix)
    }
    numbered = {path: int(step) for path, step in steps.items() if step.isdigit()}
    return max(numbered, key=numbered.__getitem__, default=None)


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


# --- Checkpoint sets: one manifest per checkpoint of a multi-rank run ---------------------------

SET_FORMAT = "brakeline-checkpoint-set/1"
MANIFEST_SUFFIX = ".manifest.json"
SHARD_FIELDS = ("rank", "path", "bytes", "sha256")


class IncompleteCheckpointSet(ValueError):
    """A set with a rank's shard missing, of another size or hash: ``rank`` names it."""

    def __init__(self, message: str, rank: int | None) -> None:
        super().__init__(message)
        self.rank = rank


@dataclasses.dataclass
class CheckpointSet:
    """A manifest: the step, the world size and every rank's file (path, bytes, SHA-256)."""

    path: str  # the manifest's
    sha256: str  # the manifest's
    step: int
    world_size: int
    shards: list[dict[str, Any]]

    def shard(self, rank: int) -> dict[str, Any]:
        for shard in self.shards:
            if shard["rank"] == rank:
                return shard
        raise IncompleteCheckpointSet(
            f"checkpoint set {self.path} has no shard of rank {rank}", rank
        )

    def as_report(self) -> dict[str, Any]:
        """The ``set`` object of a checkpoint report or acknowledgement (docs/protocol.md)."""
        return {
            "manifest": self.path,
            "manifest_sha256": self.sha256,
            "world_size": self.world_size,
            "shards": [dict(shard) for shard in self.shards],
        }


def manifest_path(directory: str | Path, step: int) -> Path:
    return Path(directory) / f"step-{step:08d}{MANIFEST_SUFFIX}"


def check_shards(step: int, world_size: int, shards: Sequence[Mapping[str, Any]]) -> None:
    """Every rank of ``world_size`` exactly once, each at ``step``: else the rank is named."""
    seen: dict[int, Mapping[str, Any]] = {}
    for shard in shards:
        rank = shard.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < world_size or rank in seen:
            raise IncompleteCheckpointSet(f"shard of rank {rank!r} is out of place", None)
        if shard.get("step", step) != step:
            raise IncompleteCheckpointSet(
                f"rank {rank} saved step {shard.get('step')}, not step {step}", rank
            )
        seen[rank] = shard
    for rank in range(world_size):
        if rank not in seen:
            raise IncompleteCheckpointSet(f"rank {rank}'s shard is missing from the set", rank)


def write_manifest(
    directory: str | Path, step: int, world_size: int, shards: Sequence[Mapping[str, Any]]
) -> CheckpointSet:
    """Rank 0, once every rank's file is durable: the manifest, atomic and fsynced."""
    check_shards(step, world_size, shards)
    entries = sorted(
        ({key: shard[key] for key in SHARD_FIELDS} for shard in shards), key=lambda s: s["rank"]
    )
    folder = Path(directory).resolve()
    stored = [dict(entry, path=_relative_to(folder, entry["path"])) for entry in entries]
    body = {"format": SET_FORMAT, "step": step, "world_size": world_size, "shards": stored}

    def write(path: Path, _: int) -> None:
        with open(path, "w") as handle:
            json.dump(body, handle, indent=1, sort_keys=True)

    saved = save_atomically(manifest_path(directory, step), step, write)
    located = [dict(entry, path=_located(folder, entry["path"])) for entry in stored]
    return CheckpointSet(saved.path, saved.sha256, step, world_size, located)


def _relative_to(folder: Path, shard: str) -> str:
    """A shard's path as the manifest stores it: relative to the set's folder, so the set can
    be moved or copied whole (a shard outside that folder keeps its absolute path)."""
    try:
        return Path(shard).resolve().relative_to(folder).as_posix()
    except ValueError:
        return shard


def _located(folder: Path, stored: str) -> str:
    """Where a stored shard path points from the manifest's folder now. A relative path is
    joined to it. An absolute one (manifests of earlier SDKs) is read beside the manifest when
    a file of its name is there: the set was moved or copied, and a copy must not read the
    original's files; else it is taken as it is."""
    path = Path(stored)
    if not path.is_absolute():
        return str(folder / path)
    beside = folder / path.name
    if path.parent != folder and beside.exists():
        return str(beside)
    return stored


def read_manifest(path: str | Path, expected_sha256: str | None = None) -> CheckpointSet:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise IncompleteCheckpointSet(f"manifest {path} cannot be read: {error}", None) from None
    digest = hashlib.sha256(raw).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256:
        raise IncompleteCheckpointSet(
            f"manifest {path} has sha256 {digest}, not {expected_sha256}", None
        )
    try:
        body = json.loads(raw)
        if body.get("format") != SET_FORMAT:
            raise ValueError(f"format {body.get('format')!r}")
        step, world_size = int(body["step"]), int(body["world_size"])
        folder = path.resolve().parent
        shards = [
            dict(shard, path=_located(folder, str(shard["path"]))) for shard in body["shards"]
        ]
        found = CheckpointSet(str(path.resolve()), digest, step, world_size, shards)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise IncompleteCheckpointSet(
            f"{path} is not a checkpoint set manifest: {error}", None
        ) from None
    check_shards(found.step, found.world_size, found.shards)
    return found


def verify_set(found: CheckpointSet, hash_ranks: Sequence[int] = ()) -> None:
    """Every shard is there with its size; the shards of ``hash_ranks`` also match their
    SHA-256. Raises :class:`IncompleteCheckpointSet` naming the first rank that does not."""
    for shard in found.shards:
        rank, path = shard["rank"], Path(shard["path"])
        if not path.exists():
            raise IncompleteCheckpointSet(f"rank {rank}'s shard {path} is missing", rank)
        if shard.get("bytes") is not None and size_of(path) != shard["bytes"]:
            raise IncompleteCheckpointSet(
                f"rank {rank}'s shard {path} holds {size_of(path)} bytes, not {shard['bytes']}",
                rank,
            )
        if rank in hash_ranks and sha256_of(path) != shard["sha256"]:
            raise IncompleteCheckpointSet(
                f"rank {rank}'s shard {path} does not match its sha256 {shard['sha256']}", rank
            )


def latest_set(directory: str | Path, rank: int = 0) -> CheckpointSet | None:
    """The newest complete set in ``directory`` (this rank's shard hashed); sets that are not
    complete are skipped, each with a warning naming the rank at fault."""
    manifests = sorted(Path(directory).glob("step-*" + MANIFEST_SUFFIX), reverse=True)
    for manifest in manifests:
        try:
            found = read_manifest(manifest)
            verify_set(found, hash_ranks=(rank,))
        except IncompleteCheckpointSet as error:
            logger.warning("brakeline: checkpoint set %s skipped: %s", manifest, error)
            continue
        return found
    return None


def shard_to_restore(params: Mapping[str, Any], rank: int) -> tuple[Path, str] | None:
    """A roll back naming a set (``params.set``): this rank's shard and hash, once the manifest
    matches its hash and every shard is there (this rank's hashed); None without a set."""
    named = params.get("set")
    if not isinstance(named, Mapping):
        return None
    found = read_manifest(str(named.get("manifest")), named.get("manifest_sha256"))
    verify_set(found, hash_ranks=(rank,))
    shard = found.shard(rank)
    return Path(shard["path"]), shard["sha256"]


def gather_set(result: CheckpointResult, directory: str | Path) -> CheckpointSet | None:
    """Through the job's process group, once this rank's file is durable (``result`` comes
    from :func:`save_atomically`): every rank's entry reaches rank 0, which writes the
    manifest; every rank returns the set (None without a process group of more than one rank,
    or when the set is not complete: rank 0 logs which rank is at fault). Collective: every
    rank calls it at the same step."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    rank, world_size = dist.get_rank(), dist.get_world_size()
    entry = {
        "rank": rank,
        "path": result.path,
        "bytes": result.bytes,
        "sha256": result.sha256,
        "step": result.step,
    }
    entries: list[Any] = [None] * world_size
    dist.all_gather_object(entries, entry)
    made: list[Any] = [None]
    if rank == 0:
        try:
            made[0] = dataclasses.asdict(
                write_manifest(directory, result.step, world_size, entries)
            )
        except IncompleteCheckpointSet as error:
            logger.error("brakeline: checkpoint set of step %d not written: %s", result.step, error)
    dist.broadcast_object_list(made, src=0)
    return CheckpointSet(**made[0]) if made[0] is not None else None
