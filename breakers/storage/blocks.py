"""A block: up to ``BLOCK_COLUMNS`` loggings of steps of one rank and node, as arrays.

Pure (no Django): the shape ingest writes a batch's points in on PostgreSQL (one block per rank
and node of the batch, ``breakers.agent.store``) and compaction merges narrow blocks into wide
ones (``breakers.storage.compaction``). The row layout is ``MetricBlock``'s: steps and times
once, every metric's values as one 2-D ``float8[]`` (NULL where a metric was not logged: NULL
is absence, NaN and ±Inf are values), per-point microsecond offsets only when some point's time
differs from its column's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

BLOCK_COLUMNS = 256  # steps (loggings of a step) per block
# A block never spans more steps than this, so a step-range read finds its blocks on the
# (job, first_step) index between low - span and high (brakeline_points relies on it).
BLOCK_STEP_SPAN = 65_536
# Metrics × columns of one block at most: a job logging hundreds of metrics a step (per-layer
# gradient norms) gets narrower blocks, never a grid of millions of mostly absent cells.
BLOCK_CELLS = 65_536
_DELTA_LIMIT = 2**31 - 1  # microseconds a point's time may lie from its column's (int4)
_MICROSECOND = timedelta(microseconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_microseconds(moment_: datetime) -> int:
    """Microseconds since the epoch, exactly (no float on the way)."""
    return (moment_ - EPOCH) // _MICROSECOND


@dataclass
class _Column:
    step: int
    time: int  # microseconds since the epoch (exact: times are parsed once, as integers)
    values: dict[str, tuple[float, int]] = field(default_factory=dict)  # name → (value, µs)


@dataclass
class Block:
    rank: int
    node: str | None
    columns: list[_Column]
    last_id: int

    def row(self, job_id: int) -> tuple[Any, ...]:
        names = sorted({name for column in self.columns for name in column.values})
        absent = (None, None)
        vals = [[c.values.get(name, absent)[0] for c in self.columns] for name in names]
        deltas = [[c.values.get(name, absent)[1] for c in self.columns] for name in names]
        shifted = any(d for row in deltas for d in row)
        times = [moment(c.time) for c in self.columns]
        listed = [c.step for c in self.columns]
        # Contiguous, each once (the usual case): NULL, and brakeline_points regenerates them.
        steps = None if listed == list(range(listed[0], listed[0] + len(listed))) else listed
        point_times = [c.time + delta for c in self.columns for _, delta in c.values.values()]
        return (
            job_id,
            self.rank,
            self.node,
            self.columns[0].step,
            self.columns[-1].step,
            moment(min(point_times)),
            moment(max(point_times)),
            self.last_id,
            names,
            steps,
            times,
            vals,
            deltas if shifted else None,
        )


def moment(microseconds: int) -> datetime:
    return EPOCH + microseconds * _MICROSECOND


def _columns(points: list[tuple]) -> list[_Column]:
    """One rank's points (id order) as columns in step order: a column holds each metric at
    most once, so a step logged again (a restart re-logging it) opens a second column for it."""
    by_key: dict[tuple[int, int], _Column] = {}
    # The first column each (metric, step) may still go in: a rank logging one metric at one
    # step a million times (hostile, or a loop gone wrong) costs a million steps, not 10¹².
    free: dict[tuple[str, int], int] = {}
    for _, name, step, time, value, _, _ in points:
        k = free.get((name, step), 0)
        while True:
            column = by_key.get((step, k))
            if column is None:
                by_key[(step, k)] = _Column(step, time, {name: (value, 0)})
                break
            delta = time - column.time
            if name not in column.values and -_DELTA_LIMIT <= delta <= _DELTA_LIMIT:
                column.values[name] = (value, delta)
                break
            k += 1
        free[(name, step)] = k + 1
    return [by_key[key] for key in sorted(by_key)]


def blocks_of(points: list[tuple]) -> list[Block]:
    """Points ``(id, name, step, µs since the epoch, value, node, rank)`` in id order → blocks,
    each of one
    rank and node, at most ``BLOCK_COLUMNS`` columns, less than ``BLOCK_STEP_SPAN`` steps and
    at most ``BLOCK_CELLS`` metrics × columns (a single column may hold more)."""
    groups: dict[tuple[int, str | None], list[tuple]] = {}
    for point in points:
        groups.setdefault((point[6], point[5]), []).append(point)
    blocks = []
    for (rank, node), members in groups.items():
        last_id = max(p[0] for p in members)
        current: list[_Column] = []
        names: set[str] = set()
        for column in _columns(members):
            if current and (
                len(current) == BLOCK_COLUMNS
                or column.step - current[0].step >= BLOCK_STEP_SPAN
                or len(names.union(column.values)) * (len(current) + 1) > BLOCK_CELLS
            ):
                blocks.append(Block(rank, node, current, last_id))
                current, names = [], set()
            current.append(column)
            names.update(column.values)
        blocks.append(Block(rank, node, current, last_id))
    return blocks


class Logged(Protocol):
    """A point as ingest has it (``breakers.agent.protocol.PointIn``), read-only."""

    @property
    def name(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def time(self) -> datetime | None: ...
    @property
    def value(self) -> float: ...
    @property
    def node(self) -> str | None: ...
    @property
    def rank(self) -> int: ...


_Columns = dict[tuple[int, str | None], dict[int, tuple[datetime, dict[str, float]]]]


def _columns_per_series(points: Sequence[Logged], received: datetime) -> _Columns | None:
    """Per rank and node, each step's time and metrics; None when a step is logged twice or
    its metrics at different times."""
    groups: _Columns = {}
    for p in points:
        columns = groups.get((p.rank, p.node))
        if columns is None:
            columns = groups[(p.rank, p.node)] = {}
        at = received if p.time is None else p.time
        column = columns.get(p.step)
        if column is None:
            columns[p.step] = (at, {p.name: p.value})
        elif (column[0] is not at and column[0] != at) or p.name in column[1]:
            return None
        else:
            column[1][p.name] = p.value
    return groups


def batch_rows(job_id: int, points: Sequence[Logged], received: datetime) -> list[tuple] | None:
    """A batch's block rows without ``last_id`` (ingest leaves it to the id sequence), built
    in one pass for the batch the SDK sends: in each rank and node, every step logged once,
    all its metrics stamped alike. None for any other batch (a step logged twice, metrics of
    one step at different times, a grid past ``BLOCK_CELLS`` or a span past
    ``BLOCK_STEP_SPAN``): ``blocks_of`` shapes those, at several times the cost a point."""
    groups = _columns_per_series(points, received)
    if groups is None:
        return None
    rows = []
    for (rank, node), columns in groups.items():
        steps = sorted(columns)
        for first in range(0, len(steps), BLOCK_COLUMNS):
            chunk = steps[first : first + BLOCK_COLUMNS]
            cells = [columns[step] for step in chunk]
            names = sorted({name for _, values in cells for name in values})
            if chunk[-1] - chunk[0] >= BLOCK_STEP_SPAN or len(names) * len(chunk) > BLOCK_CELLS:
                return None
            times = [at for at, _ in cells]
            contiguous = chunk[-1] - chunk[0] == len(chunk) - 1
            rows.append(
                (
                    job_id,
                    rank,
                    node,
                    chunk[0],
                    chunk[-1],
                    min(times),
                    max(times),
                    names,
                    None if contiguous else chunk,
                    times,
                    [[values.get(name) for _, values in cells] for name in names],
                    None,
                )
            )
    return rows
