"""The bounded, order-preserving store of points waiting for the console.

Points live in memory up to ``max_memory_points``; beyond that the oldest ones are written to
numbered segment files (JSON lines, one batch per file) in the spill directory. Invariant: every
point on disk is older than every point in memory, so sending the oldest segment first, then the
memory head, replays everything in the order it was logged.

Batch ids (protocol 2): every batch handed out carries an id, ``<run id>-<sequence>``, and a
batch that is sent again carries the same id *and the same points*, so the console stores it
once however often its answer is lost. That is why the memory head is *sealed* once handed
out (points logged meanwhile wait behind it), why a spilled batch keeps its id in its file name
(``<sequence>.<batch id>.jsonl``, so a restarted process replays it under the same id), and
why only a 413 (which stored nothing) may cut a sealed batch into new ones.

Thread-safety: a PointSpool is owned by the single sender thread; nothing else touches it.
"""

from __future__ import annotations

import collections
import dataclasses
import fcntl
import itertools
import logging
import os
import re
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import IO

logger = logging.getLogger("brakeline")

SEGMENT_SUFFIX = ".jsonl"


@dataclasses.dataclass
class Batch:
    """Encoded points ready to send; ``segment`` is set when they came from a spill file."""

    lines: list[str]
    segment: Path | None = None
    # Lines the segment file holds in total; a batch may be only its first part.
    segment_lines: int = 0
    batch_id: str | None = None
    rank: int = 0  # this process's; the console stores it with every point of the batch

    def body(self, heartbeat: bytes | None = None) -> bytes:
        """The request body; ``heartbeat``: this rank's heartbeat (encoded JSON) riding along
        (protocol 3). It is not one of the batch's points: a retry may carry another or none."""
        # The id is made of [A-Za-z0-9:-] only (see PointSpool.new_batch_id): no escaping.
        head = f'{{"batch":"{self.batch_id}","points":[' if self.batch_id else '{"points":['
        if self.rank:
            head = f'{{"rank":{int(self.rank)},{head[1:]}'
        tail = "]}" if heartbeat is None else '],"heartbeat":' + heartbeat.decode("utf-8") + "}"
        return (head + ",".join(self.lines) + tail).encode("utf-8")


def segment_name(sequence: int, batch_id: str) -> str:
    return f"{sequence:012d}.{batch_id}{SEGMENT_SUFFIX}"


# What this SDK writes into ids (so a batch body needs no escaping); a file named otherwise was
# not written by it, and its points get a fresh id.
_BATCH_ID = re.compile(r"[A-Za-z0-9:-]{1,100}")


def parse_segment_name(path: Path) -> tuple[int | None, str | None]:
    """(sequence, batch id) of a segment file; an SDK before batch ids wrote no id."""
    sequence, _, batch_id = path.name[: -len(SEGMENT_SUFFIX)].partition(".")
    valid = batch_id if _BATCH_ID.fullmatch(batch_id) else None
    return (int(sequence) if sequence.isdigit() else None), valid


def open_spill_directory(base: str | Path, job: str, rank: int) -> tuple[Path, IO[str]]:
    """The spill folder of this job and rank, locked so two live processes never share one.

    A restarted process of the same job and rank gets the same folder back and so replays what
    its predecessor could not deliver. The returned lock file must stay open for the run.
    """
    safe_job = "".join(c if c.isalnum() or c in "-_." else "_" for c in job) or "job"
    candidates = [f"rank-{rank}", f"rank-{rank}.pid-{os.getpid()}"]
    for name in candidates:
        directory = Path(base) / safe_job / name
        directory.mkdir(parents=True, exist_ok=True)
        lock = open(directory / ".lock", "w")  # noqa: SIM115 - held open for the run's lifetime
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return directory, lock
        except OSError:
            lock.close()
    raise OSError(f"spill directory for {job} rank {rank} is locked by another process")


class PointSpool:
    """Memory queue plus spill segments, bounded in memory and on disk."""

    def __init__(
        self,
        directory: str | Path,
        batch_points: int = 1000,
        batch_bytes: int = 1024 * 1024,
        max_memory_points: int = 50_000,
        max_spill_bytes: int = 512 * 1024 * 1024,
        run_id: str | None = None,
        rank: int = 0,
    ) -> None:
        self.rank = rank
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.batch_points = batch_points
        self.batch_bytes = batch_bytes
        self.max_memory_points = max(max_memory_points, batch_points)
        self.max_spill_bytes = max_spill_bytes
        self.dropped = 0
        self._memory: collections.deque[str] = collections.deque()
        # segment path -> (points, bytes); insertion order is age order.
        self._segments: dict[Path, tuple[int, int]] = {}
        self._spilled_points = 0
        self._spilled_bytes = 0
        self._next_sequence = 0
        # Unique per process: a restarted process never reuses its predecessor's ids.
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self._batches_made = 0
        self._sealed: Batch | None = None  # the memory head, handed out, not yet committed
        self._segment_ids: dict[Path, str] = {}
        self._adopt_existing_segments()

    # -- state ---------------------------------------------------------------------------------
    @property
    def memory_points(self) -> int:
        return len(self._memory)

    @property
    def spilled_points(self) -> int:
        return self._spilled_points

    @property
    def spilled_bytes(self) -> int:
        return self._spilled_bytes

    def _track_segment(self, segment: Path, points: int, size: int) -> None:
        """Record a segment's size; running totals keep every check O(1) in long outages."""
        old_points, old_size = self._segments.pop(segment, (0, 0))
        self._spilled_points += points - old_points
        self._spilled_bytes += size - old_size
        if points:
            self._segments[segment] = (points, size)

    @property
    def pending_points(self) -> int:
        return self.memory_points + self.spilled_points

    # -- producer side ---------------------------------------------------------------------------
    def add(self, lines: Iterable[str]) -> None:
        """Queue encoded points; spill the oldest to disk when memory is over its bound."""
        self._memory.extend(lines)
        if len(self._memory) > self.max_memory_points:
            # Spill down to half the bound so a long outage writes whole batches, not one per log.
            while len(self._memory) > self.max_memory_points // 2:
                self._spill_head()

    def spill_all(self) -> None:
        """Move everything still in memory to disk (at finish, when the console is away)."""
        while self._memory:
            self._spill_head()

    # -- consumer side ---------------------------------------------------------------------------
    def new_batch_id(self) -> str:
        self._batches_made += 1
        return f"{self.run_id}-{self._batches_made}"

    def next_batch(self) -> Batch | None:
        """The oldest pending batch, or None. It stays pending until :meth:`commit`, and until
        then every call hands out the same points under the same id."""
        while self._segments:
            segment = next(iter(self._segments))
            lines = self._read_segment(segment)
            if lines:
                prefix = self._limit(lines)
                batch_id = self._segment_ids[segment]
                if len(prefix) < len(lines):
                    # Only a 413 makes batches smaller than a segment; the same cut then
                    # gets the same id on every retry.
                    batch_id = f"{batch_id}:{len(prefix)}"
                return Batch(
                    prefix, segment, segment_lines=len(lines), batch_id=batch_id, rank=self.rank
                )
            self._forget_segment(segment)
        if self._sealed is not None:
            return self._sealed
        if not self._memory:
            return None
        self._sealed = Batch(
            lines=self._limit(self._memory), batch_id=self.new_batch_id(), rank=self.rank
        )
        return self._sealed

    def unseal(self) -> None:
        """Forget the sealed head: the console stored none of it (413), so its points may be
        cut into smaller batches under new ids."""
        self._sealed = None

    def commit(self, batch: Batch) -> None:
        """Remove a batch that the console accepted (or that must be dropped)."""
        if batch.segment is not None and len(batch.lines) >= batch.segment_lines:
            self._forget_segment(batch.segment)
        elif batch.segment is not None:
            self._rewrite_segment(batch.segment, len(batch.lines))
        else:
            for _ in range(len(batch.lines)):
                self._memory.popleft()
            self._sealed = None

    def drop(self, batch: Batch, why: str) -> None:
        """Remove a batch the console refused for good, counting and reporting the loss."""
        self.commit(batch)
        self._count_dropped(len(batch.lines), why)

    # -- internals -------------------------------------------------------------------------------
    def _limit(self, source: Iterable[str]) -> list[str]:
        """The longest prefix of source within the batch limits (always at least one line)."""
        lines: list[str] = []
        size = 196  # the envelope: {"rank":N,"batch":"<id of up to 150 characters>","points":[]}
        for line in itertools.islice(source, self.batch_points):
            if lines and size + len(line) + 1 > self.batch_bytes:
                break
            lines.append(line)
            size += len(line) + 1
        return lines

    def _spill_head(self) -> None:
        # The sealed head may have reached the console already: on disk it keeps its id.
        sealed, self._sealed = self._sealed, None
        lines = sealed.lines if sealed is not None else self._limit(self._memory)
        batch_id = sealed.batch_id if sealed is not None else self.new_batch_id()
        for _ in lines:
            self._memory.popleft()
        path = self.directory / segment_name(self._next_sequence, str(batch_id))
        self._next_sequence += 1
        try:
            size = self._write_segment(path, lines)
        except OSError as error:
            self._count_dropped(len(lines), f"spill file not writable: {error}")
            return
        self._segment_ids[path] = str(batch_id)
        self._track_segment(path, len(lines), size)
        while self.spilled_bytes > self.max_spill_bytes and len(self._segments) > 1:
            oldest = next(iter(self._segments))
            points = self._segments[oldest][0]
            self._forget_segment(oldest)
            self._count_dropped(points, "spill directory over its size limit")

    @staticmethod
    def _write_segment(path: Path, lines: list[str]) -> int:
        payload = "".join(line + "\n" for line in lines)
        temporary = path.with_suffix(".tmp")
        # Write-then-rename: a reader (or a restarted process) never sees half a segment.
        temporary.write_text(payload, encoding="utf-8")
        os.replace(temporary, path)
        return len(payload)

    def _rewrite_segment(self, segment: Path, sent: int) -> None:
        """Keep the unsent rest of a segment: a new batch (new id), in the segment's place."""
        remaining = self._read_segment(segment)[sent:]
        sequence, _ = parse_segment_name(segment)
        batch_id = self.new_batch_id()
        renamed = self.directory / segment_name(sequence or 0, batch_id)
        try:
            size = self._write_segment(renamed, remaining)
        except OSError as error:
            self._forget_segment(segment)
            self._count_dropped(len(remaining), f"spill file not writable: {error}")
            return
        # It keeps its age (position) among the segments: the dict is rebuilt in order.
        old_points, old_size = self._segments[segment]
        self._segments = {
            (renamed if path == segment else path): (
                (len(remaining), size) if path == segment else sizes
            )
            for path, sizes in self._segments.items()
        }
        self._segment_ids[renamed] = batch_id
        self._segment_ids.pop(segment, None)
        self._spilled_points += len(remaining) - old_points
        self._spilled_bytes += size - old_size
        segment.unlink(missing_ok=True)

    def _read_segment(self, segment: Path) -> list[str]:
        try:
            text = segment.read_text(encoding="utf-8")
        except OSError as error:
            logger.warning("brakeline: cannot read spill segment %s: %s", segment, error)
            return []
        return [line for line in text.splitlines() if line.startswith("{") and line.endswith("}")]

    def _forget_segment(self, segment: Path) -> None:
        self._track_segment(segment, 0, 0)
        self._segment_ids.pop(segment, None)
        try:
            segment.unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            logger.warning("brakeline: cannot remove spill segment %s: %s", segment, error)

    def _count_dropped(self, points: int, why: str) -> None:
        self.dropped += points
        logger.warning(
            "brakeline: dropped %d metric points (%s); %d dropped in total",
            points,
            why,
            self.dropped,
        )

    def _adopt_existing_segments(self) -> None:
        existing = sorted(self.directory.glob("*" + SEGMENT_SUFFIX))
        for stale in self.directory.glob("*.tmp"):
            stale.unlink(missing_ok=True)
        for segment in existing:
            lines = self._read_segment(segment)
            sequence, batch_id = parse_segment_name(segment)
            # A segment of an SDK before batch ids gets one now (it may be stored twice).
            self._segment_ids[segment] = batch_id or self.new_batch_id()
            self._track_segment(segment, len(lines), segment.stat().st_size)
            if sequence is not None:
                self._next_sequence = max(self._next_sequence, sequence + 1)
        if existing:
            logger.info(
                "brakeline: replaying %d points left in %s by an earlier process",
                self.spilled_points,
                self.directory,
            )
