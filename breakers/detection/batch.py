"""A batch of points through a `JobEvaluator` at once — numpy, no Django.

`feed_batch(evaluator, batch)` answers exactly what feeding the batch's points one by one to
`JobEvaluator.feed` answers: the same findings in the same order, the same detector and episode
state after it. It gets there in two passes.
1. Judge: per rule, the points its selector matches are grouped into the rule's series (one
   array sort, not a dictionary look-up per point and rule), and each series' points are judged
   as arrays where a detector has an array form (``breakers.detection.arrays``: non-finite
   checks, thresholds, rolling windows in points), by the detector's own `observe` otherwise.
   A detector's state depends on its own points only, so series can be judged one after another.
2. Edges: the points that can move an episode (an anomalous verdict, or any opinion while the
   series fires) are walked in the batch's order, rule after rule within a point as `feed`
   does, through the engine's own edge trigger. ``apply`` sees each finding before the next
   point is walked: a caller that re-arms a rule's episodes (evaluation's "logged before the
   resume") re-arms them for the rest of the batch, as between two `feed` calls.
A quiet series (no anomaly, no open episode) costs its array operations and nothing in pass 2.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from breakers.detection.arrays import (
    ASK,
    CODE_ANOMALOUS,
    CODE_UNKNOWN,
    CODES,
    RollingRows,
    judge_rolling,
    non_finite_codes,
    threshold_codes,
    usable,
)
from breakers.detection.detectors import (
    ANOMALOUS,
    HEALTHY_VERDICT,
    PENDING_VERDICT,
    UNKNOWN_VERDICT,
    DeviationDetector,
    Verdict,
)
from breakers.detection.engine import (
    DETECTOR_KINDS,
    Finding,
    JobEvaluator,
    Point,
    RuleSpec,
    SeriesKey,
)

# Points per evaluation transaction (breakers.detection.evaluation): bounds the lock time and
# the memory of one step while sharing the restore and save of the engine's state among many
# points. That state grows with the job's series (every rank's rolling windows: ~700,000
# values for a thousand ranks), so a chunk also gives each stored series POINTS_PER_SERIES
# points on average, up to MAX_CHUNK_POINTS (bench/detectors.py: a thousand ranks' chunk of
# 5,000 points spent ~70 µs per point on that round trip).
CHUNK_POINTS = 5_000
POINTS_PER_SERIES = 8
MAX_CHUNK_POINTS = 50_000

T = TypeVar("T")
SINGLE_VERDICTS = (UNKNOWN_VERDICT, HEALTHY_VERDICT, PENDING_VERDICT)
# Below this many points per series (a thousand ranks' few points each) moving a rolling
# window's state into arrays and back costs more than `observe` on each point.
ROLLING_POINTS_PER_SERIES = 2


@dataclass
class PointBatch:
    """Points as columns, in the order they are to be evaluated."""

    names: list[str]
    steps: list[int]
    times: list[float]
    values: list[float]
    nodes: list[str | None]
    ranks: list[int]
    array: np.ndarray = field(init=False, repr=False)  # the values as float64

    def __post_init__(self) -> None:
        self.array = np.array(self.values, dtype=np.float64)

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]]) -> PointBatch:
        """From (name, step, time, value, node, rank) rows."""
        columns = [list(column) for column in zip(*rows, strict=True)] or [[]] * 6
        names, steps, times, values, nodes, ranks = columns
        return cls(names, steps, times, values, nodes, ranks)

    @classmethod
    def from_points(cls, points: Iterable[Point]) -> PointBatch:
        return cls.from_rows((p.name, p.step, p.time, p.value, p.node, p.rank) for p in points)

    def __len__(self) -> int:
        return len(self.names)

    def point(self, i: int) -> Point:
        return Point(
            self.names[i],
            self.steps[i],
            self.times[i],
            self.values[i],
            self.nodes[i],
            self.ranks[i],
        )


@dataclass
class _RuleGroups:
    """One rule's points of a batch, sorted by series (batch order within a series)."""

    rule_pos: int
    rule: RuleSpec
    idx: np.ndarray  # batch indices, series after series
    group: np.ndarray  # the series (index into keys) of each
    starts: list[int]
    keys: list[SeriesKey]
    codes: np.ndarray = field(init=False)
    verdicts: dict[int, Verdict] = field(default_factory=dict)  # by position in idx
    described: dict[int, str] = field(default_factory=dict)  # descriptions read from state

    def __post_init__(self) -> None:
        self.codes = np.zeros(len(self.idx), dtype=np.int8)

    def bounds(self, g: int) -> tuple[int, int]:
        end = self.starts[g + 1] if g + 1 < len(self.starts) else len(self.idx)
        return self.starts[g], end


@dataclass
class _Judged:
    """A series' verdicts on its points of the batch, for pass 2."""

    key: SeriesKey
    rule_pos: int
    idx: np.ndarray
    codes: np.ndarray
    verdicts: dict[int, Verdict]
    described: dict[int, str]

    def verdict(self, pos: int) -> Verdict:
        return self.verdicts.get(pos) or SINGLE_VERDICTS[self.codes[pos]]


def chunk_points(series: int) -> int:
    """Points of the next chunk of a job whose stored state holds `series` series."""
    return min(MAX_CHUNK_POINTS, max(CHUNK_POINTS, POINTS_PER_SERIES * series))


def feed_batch(
    evaluator: JobEvaluator,
    batch: PointBatch,
    apply: Callable[[Finding], None] | None = None,
) -> list[Finding]:
    """Evaluate the batch's points in order; what `evaluator.feed` point by point returns."""
    if not len(batch):
        return []
    rules = _groups(evaluator, batch)
    _add_series(evaluator, rules)
    firing = {key for key, series in evaluator._series.items() if series.episode.firing}
    judged: list[_Judged] = []
    for rule in rules:
        _judge(evaluator, batch, rule)
        judged += _movers(rule, firing)
    return _edges(evaluator, batch, judged, apply)


def _codes(values: Sequence[Any]) -> np.ndarray:
    """Small integers standing for the values (equal values, equal codes)."""
    index = {value: code for code, value in enumerate(dict.fromkeys(values))}
    return np.fromiter(map(index.__getitem__, values), dtype=np.int64, count=len(values))


def _groups(evaluator: JobEvaluator, batch: PointBatch) -> list[_RuleGroups]:
    """Every rule's series of the batch with their points, rules in evaluation order."""
    names = _codes(batch.names)
    nodes, ranks = _codes(batch.nodes), _codes(batch.ranks)
    first_of = {name: i for i, name in reversed(list(enumerate(batch.names)))}
    matched = {name: {id(rule) for rule in evaluator._rules_for(name)} for name in first_of}
    size = len(batch)
    out: list[_RuleGroups] = []
    for pos, rule in enumerate(evaluator.rules):
        wanted = [names[i] for name, i in first_of.items() if id(rule) in matched[name]]
        if not wanted:
            continue
        idx = np.flatnonzero(np.isin(names, wanted))
        combined = np.zeros(len(idx), dtype=np.int64)
        if rule.per_metric:
            combined = names[idx] * size + ranks[idx]
        if rule.per_node:
            combined = combined * size + nodes[idx]
        _, inverse = np.unique(combined, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        counts = np.bincount(inverse)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        idx = idx[order]
        keys = [
            (
                rule.key,
                batch.names[first] if rule.per_metric else "*",
                batch.nodes[first] if rule.per_node else None,
                batch.ranks[first] if rule.per_metric else None,
            )
            for first in idx[starts].tolist()
        ]
        out.append(_RuleGroups(pos, rule, idx, inverse[order], starts.tolist(), keys))
    return out


def _add_series(evaluator: JobEvaluator, rules: list[_RuleGroups]) -> None:
    """The batch's new series, created in the order `feed` would meet them."""
    new = [
        (int(rule.idx[start]), rule.rule_pos, rule.rule, key)
        for rule in rules
        for start, key in zip(rule.starts, rule.keys, strict=True)
        if key not in evaluator._series
    ]
    for _, _, spec, key in sorted(new, key=lambda entry: entry[:2]):
        evaluator._add_series(spec, key)


def _judge(evaluator: JobEvaluator, batch: PointBatch, rule: _RuleGroups) -> None:
    """Pass 1: the verdict of every point of the rule's series, in `rule.codes`."""
    spec = rule.rule
    if spec.detector == "non_finite":
        _screened(evaluator, batch, rule, non_finite_codes(batch.array))
    elif spec.detector == "threshold":
        _screened(evaluator, batch, rule, threshold_codes(spec.config, batch.array))
    elif (
        spec.detector in ("deviation", "sustained")
        and spec.config.window is not None
        and len(rule.idx) >= ROLLING_POINTS_PER_SERIES * len(rule.keys)
    ):
        _rolling(evaluator, batch, rule)
    else:
        _observed(evaluator, batch, rule, range(len(rule.idx)))
    if not DETECTOR_KINDS[spec.detector].time_based:
        return
    for g, key in enumerate(rule.keys):
        last = int(rule.idx[rule.bounds(g)[1] - 1])
        evaluator._series[key].last = [batch.names[last], batch.steps[last], batch.nodes[last]]


def _movers(rule: _RuleGroups, firing: set[SeriesKey]) -> list[_Judged]:
    """The rule's series that can move an episode: an anomalous verdict, or one open."""
    anomalous = set(rule.group[rule.codes == CODE_ANOMALOUS].tolist())
    verdicts, described = _by_series(rule, rule.verdicts), _by_series(rule, rule.described)
    out = []
    for g, key in enumerate(rule.keys):
        if g in anomalous or key in firing:
            start, end = rule.bounds(g)
            idx, codes = rule.idx[start:end], rule.codes[start:end]
            found = verdicts.get(g, {}), described.get(g, {})
            out.append(_Judged(key, rule.rule_pos, idx, codes, *found))
    return out


def _by_series(rule: _RuleGroups, by_position: dict[int, T]) -> dict[int, dict[int, T]]:
    """Items keyed by position in the rule's points, regrouped by series and local position."""
    grouped: dict[int, dict[int, T]] = {}
    for pos, item in by_position.items():
        g = int(rule.group[pos])
        grouped.setdefault(g, {})[pos - rule.starts[g]] = item
    return grouped


def _screened(
    evaluator: JobEvaluator, batch: PointBatch, rule: _RuleGroups, codes: np.ndarray
) -> None:
    """A stateless detector's array codes; the asked points judged by its `observe`."""
    rule.codes = codes[rule.idx]
    _observed(evaluator, batch, rule, np.flatnonzero(rule.codes == ASK).tolist())


def _observed(
    evaluator: JobEvaluator, batch: PointBatch, rule: _RuleGroups, positions: Iterable[int]
) -> None:
    """The per-point path: the detector's own `observe` on the given points, in order."""
    group, idx = rule.group.tolist(), rule.idx.tolist()
    states: dict[int, int] = {}
    current, detector = -1, None
    for pos in positions:
        g = group[pos]
        if g != current:
            current, detector = g, evaluator._series[rule.keys[g]].detector
        assert detector is not None
        point = batch.point(idx[pos])
        verdict = detector.observe(point)
        states[pos] = CODES[verdict.state]
        if verdict.state == ANOMALOUS:
            rule.verdicts[pos] = verdict
            if detector.describe_reads_state:
                value = verdict.observed if verdict.observed is not None else point.value
                rule.described[pos] = detector.describe(point.name, value, verdict)
    if states:
        rule.codes[list(states)] = list(states.values())


def _rolling(evaluator: JobEvaluator, batch: PointBatch, rule: _RuleGroups) -> None:
    """Rolling windows in points: the rule's series advanced together as arrays, one row
    each; a value that may not enter the statistics (non-finite, absurd) has no opinion."""
    detectors = []
    for key in rule.keys:
        detector = evaluator._series[key].detector
        assert isinstance(detector, DeviationDetector)
        detectors.append(detector)
    values = batch.array[rule.idx]
    kept = np.flatnonzero(usable(values))  # positions in rule order, series after series
    row = rule.group[kept]
    lengths = np.bincount(row, minlength=len(detectors))
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    column = np.arange(len(kept)) - offsets[row]
    x = np.full((len(detectors), int(lengths.max(initial=0)) or 1), np.nan)
    x[row, column] = values[kept]
    points, starts = rule.idx[kept].tolist(), offsets.tolist()
    rows = RollingRows(
        detectors, x, lengths.tolist(), lambda r, j: batch.point(points[starts[r] + j])
    )
    judge_rolling(rows)
    rule.codes[:] = CODE_UNKNOWN
    rule.codes[kept] = rows.codes[row, column]
    for (r, j), verdict in rows.verdicts.items():
        rule.verdicts[int(kept[starts[r] + j])] = verdict


def _edges(
    evaluator: JobEvaluator,
    batch: PointBatch,
    judged: list[_Judged],
    apply: Callable[[Finding], None] | None,
) -> list[Finding]:
    """Pass 2: episodes advanced in the batch's order, rule after rule within a point."""
    ranked = [i for i, rank in enumerate(batch.ranks) if rank]
    multi_from = ranked[0] if ranked else len(batch)
    queue: list[tuple[int, int, int, int]] = []
    for n, j in enumerate(judged):
        _push(queue, evaluator, j, n, 0)
    findings: list[Finding] = []
    while queue:
        i, _, n, pos = heapq.heappop(queue)
        j = judged[n]
        series = evaluator._series[j.key]
        code = j.codes[pos]
        if code == CODE_ANOMALOUS or (series.episode.firing and code != CODE_UNKNOWN):
            if i >= multi_from:
                evaluator.multi_rank = True
            finding = evaluator._advance(
                series, j.verdict(pos), batch.point(i), j.described.get(pos)
            )
            if finding is not None:
                findings.append(finding)
                if apply is not None:
                    apply(finding)
        _push(queue, evaluator, j, n, pos + 1)
    if ranked:
        evaluator.multi_rank = True
    return findings


def _push(
    queue: list[tuple[int, int, int, int]], evaluator: JobEvaluator, j: _Judged, n: int, start: int
) -> None:
    """Queue the series' next point that can move its episode: any opinion while it fires,
    else the next anomalous verdict. A series re-armed meanwhile skips ahead when popped."""
    codes = j.codes[start:]
    if evaluator._series[j.key].episode.firing:
        hits = np.flatnonzero(codes != CODE_UNKNOWN)
    else:
        hits = np.flatnonzero(codes == CODE_ANOMALOUS)
    if len(hits):
        pos = start + int(hits[0])
        heapq.heappush(queue, (int(j.idx[pos]), j.rule_pos, n, pos))
