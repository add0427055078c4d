"""Detectors over arrays of points — numpy, no Django.

A batch of a thousand ranks' points is mostly quiet: finite values under their thresholds,
losses inside their windows. These functions find the quiet points with array operations and
leave every other point to its detector's own `observe` (``breakers.detection.detectors``), which
stays the one statement of each rule: the arrays only decide "healthy" or "no opinion", the same
way and with the same IEEE operations as `observe` would, so the alerts are bit for bit those of
the per-point detectors (tests/breakers/test_batch_detectors.py holds the two to the same answers).

State codes (one int8 per point): UNKNOWN, HEALTHY, PENDING, ANOMALOUS as the verdict states,
ASK for a point its detector must judge itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np

from breakers.detection.detector_base import (
    ANOMALOUS,
    HEALTHY,
    MAX_MAGNITUDE,
    PENDING,
    UNKNOWN,
    Sample,
    Verdict,
)
from breakers.detection.detectors import DeviationConfig, DeviationDetector, ThresholdConfig
from breakers.detection.rolling import RollingStats

CODE_UNKNOWN, CODE_HEALTHY, CODE_PENDING, CODE_ANOMALOUS, ASK = 0, 1, 2, 3, 4
CODES = {UNKNOWN: CODE_UNKNOWN, HEALTHY: CODE_HEALTHY, PENDING: CODE_PENDING}
CODES[ANOMALOUS] = CODE_ANOMALOUS

# Fewer points than this in a rule's rolling series: numpy's fixed cost per call outweighs the
# per-point loop, which then judges them.
MIN_ROLLING_POINTS = 64


def non_finite_codes(values: np.ndarray) -> np.ndarray:
    """`non_finite`: every finite value is healthy; the others are asked."""
    return np.where(np.isfinite(values), CODE_HEALTHY, ASK).astype(np.int8)


def threshold_codes(config: ThresholdConfig, values: np.ndarray) -> np.ndarray:
    """`threshold`: NaN has no opinion, a crossing is asked, the rest is healthy."""
    crossed = np.zeros(values.shape, dtype=bool)
    for bound, beyond in ((config.above, np.greater), (config.below, np.less)):
        if bound is not None:
            crossed |= beyond(values, bound)
            if config.inclusive:
                crossed |= values == bound
    codes = np.where(crossed, ASK, CODE_HEALTHY)
    return np.where(np.isnan(values), CODE_UNKNOWN, codes).astype(np.int8)


def usable(values: np.ndarray) -> np.ndarray:
    """`is_usable` over an array: finite and not absurdly large."""
    return (values > -MAX_MAGNITUDE) & (values < MAX_MAGNITUDE)


@dataclass
class RollingRows:
    """The series of one `deviation`/`sustained` rule (window in points) and their points.

    Row r holds a series' usable values in order (`x[r, :lengths[r]]`, NaN after);
    `sample(r, j)` builds the point of its j-th value. Judging fills `codes` and, for the
    verdicts that are not singletons, `verdicts[(r, j)]`."""

    detectors: list[DeviationDetector]
    x: np.ndarray
    lengths: list[int]
    sample: Callable[[int, int], Sample]
    done: list[int] = field(init=False)
    codes: np.ndarray = field(init=False)
    verdicts: dict[tuple[int, int], Verdict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.done = [0] * len(self.detectors)
        self.codes = np.full(self.x.shape, CODE_UNKNOWN, dtype=np.int8)

    def left(self, r: int) -> int:
        return self.lengths[r] - self.done[r]

    def vectorisable(self, r: int) -> bool:
        """An empty window restarts its reference at the next value, a frozen one expires
        nothing: both are left to `observe` until the baseline moves plainly again."""
        detector = self.detectors[r]
        return bool(detector.stats.values) and not detector.frozen_points

    def observe_next(self, r: int) -> None:
        j = self.done[r]
        verdict = self.detectors[r].observe(self.sample(r, j))
        self.codes[r, j] = CODES[verdict.state]
        if verdict.state == ANOMALOUS:
            self.verdicts[(r, j)] = verdict
        self.done[r] = j + 1


def judge_rolling(rows: RollingRows) -> None:
    """Judge every row's points: arrays for the plain stretches, `observe` for the rest.

    Each round first walks the rows whose baseline is frozen or empty point by point until it
    is not, then advances all the others together as far as their first recomputation of
    the sums (or, for a freezing baseline, their first deviating point), which `observe` then
    takes. A round advances every row by at least one point."""
    active = [r for r in range(len(rows.detectors)) if rows.left(r)]
    while active:
        for r in active:
            while rows.left(r) and not rows.vectorisable(r):
                rows.observe_next(r)
        ready = [r for r in active if rows.left(r)]
        if sum(rows.left(r) for r in ready) < MIN_ROLLING_POINTS:
            for r in ready:
                while rows.left(r):
                    rows.observe_next(r)
            return
        _advance_together(rows, ready)
        for r in ready:
            if rows.left(r):
                rows.observe_next(r)  # the event that ended its stretch
        active = [r for r in ready if rows.left(r)]


@dataclass
class _Sums:
    """The rows' window sums through the next `span` points, as `RollingStats` updates them.

    Op columns: a drop (the oldest value leaves a full window) then an add per point; a
    column without an operation adds -0.0, which changes no sum."""

    count: np.ndarray  # values in the window before each point
    s1: np.ndarray  # S1 after each op, column 0 the starting value
    s2: np.ndarray
    peak: np.ndarray
    ops: np.ndarray
    dropped: np.ndarray  # whether each point's add first drops the oldest value
    recompute: np.ndarray  # whether one of a point's ops triggers the exact recomputation


def _advance_together(rows: RollingRows, ready: list[int]) -> None:
    detectors = [rows.detectors[r] for r in ready]
    config = detectors[0].config
    left = np.array([rows.left(r) for r in ready])
    span = int(min(left.max(), 2 * (config.window or 0) + 66))
    columns = np.array([rows.done[r] for r in ready])[:, None] + np.arange(span)
    valid = np.arange(span) < left[:, None]
    x = np.take_along_axis(rows.x[ready], np.minimum(columns, rows.x.shape[1] - 1), axis=1)
    x[~valid] = np.nan
    stats = [detector.stats for detector in detectors]
    shift = np.array([s.shift for s in stats])[:, None]
    sums = _window_sums(stats, x, valid, config.window or 0)
    mean, sigma, z = _baseline(config, shift, sums, x)
    warm = sums.count < detectors[0].min_points
    deviating = _deviating(config.direction, config.k, z) & ~warm & valid
    stop = (sums.recompute | (deviating if detectors[0].freeze else False)) & valid
    ends = np.where(stop.any(axis=1), stop.argmax(axis=1), np.minimum(left, span))
    taken = np.arange(span) < ends[:, None]
    codes = np.where(warm, CODE_UNKNOWN, CODE_HEALTHY).astype(np.int8)
    row_of = np.broadcast_to(np.array(ready)[:, None], columns.shape)
    rows.codes[row_of[taken], columns[taken]] = codes[taken]
    runs = np.flatnonzero((deviating & taken).any(axis=1)).tolist()
    runs = sorted(set(runs) | {i for i, d in enumerate(detectors) if d.run_len})
    for i in runs:
        _settle(rows, ready[i], int(ends[i]), warm[i], deviating[i], (mean[i], sigma[i], z[i]))
    _store(stats, sums, ends, x)
    for i, r in enumerate(ready):
        rows.done[r] += int(ends[i])


def _window_sums(
    stats: Sequence[RollingStats], x: np.ndarray, valid: np.ndarray, width: int
) -> _Sums:
    n_rows, span = x.shape
    count0 = np.array([len(s.values) for s in stats])[:, None]
    shift = np.array([s.shift for s in stats])[:, None]
    before = np.minimum(count0 + np.arange(span), width)
    dropped = (before >= width) & valid
    head = _heads(stats, span)
    oldest = count0 + np.arange(span) - width  # index of the dropped value in window + new
    from_head = np.take_along_axis(head, np.clip(oldest, 0, head.shape[1] - 1), axis=1)
    from_new = np.take_along_axis(x, np.clip(oldest - count0, 0, span - 1), axis=1)
    gone = np.where(oldest < count0, from_head, from_new) - shift
    added = x - shift
    ops1 = np.stack([np.where(dropped, -gone, -0.0), np.where(valid, added, -0.0)], axis=2)
    ops2 = np.stack(
        [np.where(dropped, -(gone * gone), -0.0), np.where(valid, added * added, -0.0)], axis=2
    )
    start = [np.array([getattr(s, name) for s in stats])[:, None] for name in ("s1", "s2")]
    s1 = np.add.accumulate(np.hstack([start[0], ops1.reshape(n_rows, 2 * span)]), axis=1)
    s2 = np.add.accumulate(np.hstack([start[1], ops2.reshape(n_rows, 2 * span)]), axis=1)
    real = np.stack([dropped, valid], axis=2).reshape(n_rows, 2 * span)
    is_add = np.zeros((n_rows, span, 2), dtype=bool)
    is_add[:, :, 1] = valid
    peaks = np.where(is_add.reshape(n_rows, 2 * span), s2[:, 1:], -np.inf)
    peak0 = np.array([s.peak for s in stats])[:, None]
    peak = np.maximum.accumulate(np.hstack([peak0, peaks]), axis=1)
    ops0 = np.array([s.ops for s in stats])[:, None]
    ops = np.hstack([ops0, ops0 + np.cumsum(real, axis=1)])
    after = np.stack([before - 1, np.minimum(before + 1, width)], axis=2)
    after = np.where(real, after.reshape(n_rows, 2 * span), 1)
    centred = s2[:, 1:] - s1[:, 1:] * (s1[:, 1:] / after)
    cancelled = centred < RollingStats.CANCELLATION_RATIO * peak[:, 1:]
    trigger = real & ((ops[:, 1:] > 2 * after + 64) | cancelled)
    recompute = trigger.reshape(n_rows, span, 2).any(axis=2)
    return _Sums(before, s1, s2, peak, ops, dropped, recompute)


def _heads(stats: Sequence[RollingStats], span: int) -> np.ndarray:
    """The oldest `span` values of each window (the ones the stretch may drop)."""
    if span <= 64:  # indexing a deque near its left end is O(1)
        heads = [[s.values[i] for i in range(min(len(s.values), span))] for s in stats]
    else:
        heads = [list(s.values)[:span] for s in stats]
    width = max(len(h) for h in heads) or 1
    if all(len(h) == width for h in heads):
        return np.array(heads, dtype=np.float64)
    head = np.full((len(heads), width), np.nan)
    for r, values in enumerate(heads):
        head[r, : len(values)] = values
    return head


def _baseline(
    config: DeviationConfig, shift: np.ndarray, sums: _Sums, x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, effective σ and z of each point against the window before it (RollingStats.mean,
    .std and SigmaFloor.floored, operation for operation)."""
    n = sums.count
    s1, s2 = sums.s1[:, 0:-1:2], sums.s2[:, 0:-1:2]
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = shift + s1 / n
        m = s1 / n
        sigma = np.sqrt(np.maximum(s2 / n - m * m, 0.0))
        floored = np.maximum(sigma, config.sigma_floor_rel * np.abs(mean))
        sigma = np.maximum(floored, config.sigma_floor_abs)
        z = (x - mean) / sigma
    return mean, sigma, z


def _deviating(direction: str, k: float, z: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        if direction == "both":
            return np.abs(z) > k
        return z > k if direction == "above" else z < -k


def _settle(
    rows: RollingRows,
    r: int,
    end: int,
    warm: np.ndarray,
    deviating: np.ndarray,
    baseline: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Verdicts of a row's points inside a run or deviating (a baseline that absorbs): the
    detector's own run bookkeeping, with the baseline the arrays computed."""
    first, detector = rows.done[r], rows.detectors[r]
    marks = np.flatnonzero(deviating[:end])
    mean, sigma, z = baseline
    j = 0 if detector.run_len else int(marks[0])
    while j < end:
        if warm[j]:
            j += 1
            continue
        if deviating[j]:
            point = rows.sample(r, first + j)
            verdict = detector._extend_run(point, float(mean[j]), float(sigma[j]), float(z[j]))
        else:
            verdict = detector._continue_or_break_run()
        rows.codes[r, first + j] = CODES[verdict.state]
        if verdict.state == ANOMALOUS:
            rows.verdicts[(r, first + j)] = verdict
        j += 1
        if not detector.run_len:
            later = marks[marks >= j]
            j = int(later[0]) if len(later) else end


def _store(stats: Sequence[RollingStats], sums: _Sums, ends: np.ndarray, x: np.ndarray) -> None:
    """Each window as RollingStats holds it after its row's stretch."""
    picked = np.arange(len(stats)), 2 * ends
    s1, s2 = sums.s1[picked].tolist(), sums.s2[picked].tolist()
    peak, ops = sums.peak[picked].tolist(), sums.ops[picked].tolist()
    taken = np.arange(x.shape[1]) < ends[:, None]
    drops = np.count_nonzero(sums.dropped & taken, axis=1).tolist()
    added = x.tolist()
    for i, end in enumerate(ends.tolist()):
        if not end:
            continue
        s = stats[i]
        values = s.values
        values.extend(added[i][:end])
        for _ in repeat(None, drops[i]):
            values.popleft()
        s.s1, s.s2, s.peak, s.ops = s1[i], s2[i], peak[i], int(ops[i])
