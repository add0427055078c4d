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
from itertools import islice, repeat

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
class RollingRow:
    """One series of a `deviation`/`sustained` rule with a window in points, and its points.

    `values` are the usable values in order, `sample(j)` builds the point of the j-th; the
    judged codes and the verdicts that are not singletons fill `codes` and `verdicts`."""

    detector: DeviationDetector
    values: np.ndarray
    sample: Callable[[int], Sample]
    done: int = 0
    codes: np.ndarray = field(init=False)
    verdicts: dict[int, Verdict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.codes = np.full(len(self.values), CODE_UNKNOWN, dtype=np.int8)

    @property
    def left(self) -> int:
        return len(self.values) - self.done

    def vectorisable(self) -> bool:
        """An empty window restarts its reference at the next value, a frozen one expires
        nothing: both are left to `observe` until the baseline moves plainly again."""
        return self.detector.stats.count > 0 and not self.detector.frozen_points

    def observe_next(self) -> None:
        j = self.done
        verdict = self.detector.observe(self.sample(j))
        self.codes[j] = CODES[verdict.state]
        if verdict.state == ANOMALOUS:
            self.verdicts[j] = verdict
        self.done += 1


def judge_rolling(rows: Sequence[RollingRow]) -> None:
    """Judge every row's points: arrays for the plain stretches, `observe` for the rest.

    Each round first walks the rows whose baseline is frozen or empty point by point until it
    is not, then advances all the others together as far as their first recomputation of
    the sums (or, for a freezing baseline, their first deviating point), which `observe` then
    takes. A round advances every row by at least one point."""
    active = [row for row in rows if row.left]
    while active:
        for row in active:
            while row.left and not row.vectorisable():
                row.observe_next()
        ready = [row for row in active if row.left]
        if sum(row.left for row in ready) < MIN_ROLLING_POINTS:
            for row in ready:
                while row.left:
                    row.observe_next()
            return
        _advance_together(ready)
        for row in ready:
            if row.left:
                row.observe_next()  # the event that ended its stretch
        active = [row for row in ready if row.left]


@dataclass
class _Sums:
    """The rows' window sums through the next L points, as `RollingStats` would update them.

    Columns of the op arrays: a drop (the oldest value leaves a full window) then an add per
    point; a column without an operation adds -0.0, which changes no sum."""

    count: np.ndarray  # values in the window before each point
    s1: np.ndarray  # S1 after each op, column 0 the starting value
    s2: np.ndarray
    peak: np.ndarray
    ops: np.ndarray
    dropped: np.ndarray  # whether each point's add first drops the oldest value
    recompute: np.ndarray  # whether one of a point's ops triggers the exact recomputation


def _advance_together(rows: Sequence[RollingRow]) -> None:
    config = rows[0].detector.config
    width = config.window or 0
    span = min(max(row.left for row in rows), 2 * width + 66)
    x = np.full((len(rows), span), np.nan)
    for r, row in enumerate(rows):
        stretch = row.values[row.done : row.done + span]
        x[r, : len(stretch)] = stretch
    lengths = np.array([min(row.left, span) for row in rows])
    valid = np.arange(span) < lengths[:, None]
    stats = [row.detector.stats for row in rows]
    shift = np.array([s.shift for s in stats])[:, None]
    sums = _window_sums(stats, x, valid, width)
    mean, sigma, z = _baseline(config, shift, sums, x)
    warm = sums.count < rows[0].detector.min_points
    deviating = _deviating(config.direction, config.k, z) & ~warm & valid
    stop = sums.recompute | (deviating if rows[0].detector.freeze else False)
    for r, row in enumerate(rows):
        hits = np.flatnonzero(stop[r, : lengths[r]])
        end = int(hits[0]) if len(hits) else int(lengths[r])
        _settle(row, end, warm[r], deviating[r], (mean[r], sigma[r], z[r]))
        _store(row.detector.stats, sums, r, end, x[r, :end])
        row.done += end


def _window_sums(
    stats: Sequence[RollingStats], x: np.ndarray, valid: np.ndarray, width: int
) -> _Sums:
    rows, span = x.shape
    count0 = np.array([s.count for s in stats])[:, None]
    shift = np.array([s.shift for s in stats])[:, None]
    before = np.minimum(count0 + np.arange(span), width)
    dropped = (before >= width) & valid
    heads = [list(islice(s.values, 0, min(s.count, span))) for s in stats]
    head = np.full((rows, max(len(h) for h in heads) or 1), np.nan)
    for r, values in enumerate(heads):
        head[r, : len(values)] = values
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
    s1 = np.add.accumulate(np.hstack([start[0], ops1.reshape(rows, 2 * span)]), axis=1)
    s2 = np.add.accumulate(np.hstack([start[1], ops2.reshape(rows, 2 * span)]), axis=1)
    real = np.stack([dropped, valid], axis=2).reshape(rows, 2 * span)
    is_add = np.zeros((rows, span, 2), dtype=bool)
    is_add[:, :, 1] = valid
    peaks = np.where(is_add.reshape(rows, 2 * span), s2[:, 1:], -np.inf)
    peak0 = np.array([s.peak for s in stats])[:, None]
    peak = np.maximum.accumulate(np.hstack([peak0, peaks]), axis=1)
    ops0 = np.array([s.ops for s in stats])[:, None]
    ops = np.hstack([ops0, ops0 + np.cumsum(real, axis=1)])
    after = np.stack([before - 1, np.minimum(before + 1, width)], axis=2).reshape(rows, 2 * span)
    after = np.where(real, after, 1)
    centred = s2[:, 1:] - s1[:, 1:] * (s1[:, 1:] / after)
    cancelled = centred < RollingStats.CANCELLATION_RATIO * peak[:, 1:]
    trigger = real & ((ops[:, 1:] > 2 * after + 64) | cancelled)
    recompute = trigger.reshape(rows, span, 2).any(axis=2)
    return _Sums(before, s1, s2, peak, ops, dropped, recompute)


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
    row: RollingRow,
    end: int,
    warm: np.ndarray,
    deviating: np.ndarray,
    baseline: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Verdicts of a row's first `end` points of the stretch. A point that deviates (a baseline
    that absorbs) or one inside a run goes through the detector's own run bookkeeping."""
    first = row.done
    codes = row.codes[first : first + end]
    codes[:] = np.where(warm[:end], CODE_UNKNOWN, CODE_HEALTHY)
    detector = row.detector
    marks = np.flatnonzero(deviating[:end])
    if not len(marks) and not detector.run_len:
        return
    mean, sigma, z = baseline
    j = 0 if detector.run_len else int(marks[0])
    while j < end:
        if warm[j]:
            j += 1
            continue
        if deviating[j]:
            point = row.sample(first + j)
            verdict = detector._extend_run(point, float(mean[j]), float(sigma[j]), float(z[j]))
        else:
            verdict = detector._continue_or_break_run()
        codes[j] = CODES[verdict.state]
        if verdict.state == ANOMALOUS:
            row.verdicts[first + j] = verdict
        j += 1
        if not detector.run_len:
            later = marks[marks >= j]
            j = int(later[0]) if len(later) else end


def _store(stats: RollingStats, sums: _Sums, r: int, end: int, added: np.ndarray) -> None:
    """The window as RollingStats holds it after the stretch's first `end` points."""
    column = 2 * end
    values = stats.values
    values.extend(added.tolist())
    for _ in repeat(None, int(np.count_nonzero(sums.dropped[r, :end]))):
        values.popleft()
    stats.s1 = float(sums.s1[r, column])
    stats.s2 = float(sums.s2[r, column])
    stats.peak = float(sums.peak[r, column])
    stats.ops = int(sums.ops[r, column])
