"""Sliding-window mean and σ with O(1) updates — pure Python, no Django.

Used by the deviation detectors (`breakers.detection.detectors`); kept apart because its numerics
(shifted
sums, exact recomputation on cancellation) are the delicate part and are tested on their own.
"""

from __future__ import annotations

import base64
import math
import sys
from array import array
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any


class RollingStats:
    """Mean and population σ of a sliding window (last W values, or values of the last T s).

    Numerics: sums are kept *shifted* by a reference K close to the window mean,
    S1 = Σ(x−K), S2 = Σ(x−K)², var = S2/n − (S1/n)². The naive Σx² − (Σx)²/n on a loss of
    1e4 with 1e-6 noise subtracts two numbers of ~1e9 that agree in every digit and returns
    garbage (even negative variances); with K ≈ mean both terms stay small. Two things could
    still degrade the sums, and both trigger an exact recomputation (K := fsum mean, then the
    sums by fsum — O(n)):
    * cancellation: the centred sum n·var falls below 1e-6 of the largest S2 seen since the
      last recomputation (a big outlier left the window, or the level drifted far from K) —
      at most ~6 digits were lost, so σ keeps ~9 good digits;
    * accumulated rounding of adds/removals: at the latest after 2n + 64 updates.
    Each recomputation is preceded by Ω(n) updates or by a ≥1e6-fold collapse of the spread,
    so the cost is O(1) amortised per point.
    """

    __slots__ = ("window", "span", "values", "times", "shift", "s1", "s2", "peak", "ops")

    CANCELLATION_RATIO = 1e-6

    def __init__(self, window: int | None = None, span: float | None = None) -> None:
        if (window is None) == (span is None):
            raise ValueError("give exactly one of window (points) or span (seconds)")
        self.window = window
        self.span = span
        self.values: deque[float] = deque()
        self.times: deque[float] = deque()
        self.clear()

    def clear(self) -> None:
        self.values.clear()
        self.times.clear()
        self.shift = self.s1 = self.s2 = self.peak = 0.0
        self.ops = 0

    @property
    def count(self) -> int:
        return len(self.values)

    def add(self, time: float, value: float) -> None:
        """Append a (finite) value; in step mode the oldest one leaves a full window."""
        if self.window is not None and len(self.values) >= self.window:
            self._drop_oldest()
        if not self.values:
            # Empty window: restart the shift exactly at the first value (nothing to carry).
            self.shift, self.s1, self.s2, self.peak, self.ops = value, 0.0, 0.0, 0.0, 0
        d = value - self.shift
        self.values.append(value)
        if self.span is not None:
            self.times.append(time)
        self.s1 += d
        self.s2 += d * d
        if self.s2 > self.peak:
            self.peak = self.s2
        self._after_update()

    def expire(self, now: float) -> None:
        """Time mode: keep only the values with time > now − span."""
        if self.span is None:
            return
        cutoff = now - self.span
        times = self.times
        while times and times[0] <= cutoff:
            self._drop_oldest()

    def mean(self) -> float:
        return self.shift + self.s1 / len(self.values)

    def variance(self) -> float:
        n = len(self.values)
        m = self.s1 / n
        return max(self.s2 / n - m * m, 0.0)

    def std(self) -> float:
        return math.sqrt(self.variance())

    def _drop_oldest(self) -> None:
        d = self.values.popleft() - self.shift
        if self.span is not None:
            self.times.popleft()
        self.s1 -= d
        self.s2 -= d * d
        self._after_update()

    def _after_update(self) -> None:
        n = len(self.values)
        if n == 0:
            self.shift = self.s1 = self.s2 = self.peak = 0.0
            self.ops = 0
            return
        self.ops += 1
        centred = self.s2 - self.s1 * (self.s1 / n)
        if self.ops > 2 * n + 64 or centred < self.CANCELLATION_RATIO * self.peak:
            self._recompute()

    def _recompute(self) -> None:
        values = self.values
        n = len(values)
        k = math.fsum(values) / n
        self.shift = k
        self.s1 = math.fsum([x - k for x in values])
        self.s2 = math.fsum([(x - k) * (x - k) for x in values])
        self.peak = self.s2
        self.ops = 0

    def to_state(self) -> dict[str, Any]:
        return {
            "values": pack_floats(self.values),
            "times": pack_floats(self.times),
            "sums": [self.shift, self.s1, self.s2, self.peak, self.ops],
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.values = deque(unpack_floats(state["values"]))
        self.times = deque(unpack_floats(state["times"]))
        shift, s1, s2, peak, ops = state["sums"]
        self.shift, self.s1, self.s2, self.peak = float(shift), float(s1), float(s2), float(peak)
        self.ops = int(ops)


def pack_floats(values: Iterable[float]) -> str:
    """A window as base64 of its IEEE doubles (little-endian): exact, and a thousand ranks'
    windows (about a million values) encode and decode at memory speed where a JSON list of
    numbers costs a repr and a parse per value."""
    packed = array("d", values)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def unpack_floats(state: str | list[float]) -> array:
    """`pack_floats` reversed; a list of numbers (the states written before) is read too."""
    if isinstance(state, list):
        return array("d", (float(v) for v in state))
    packed = array("d", base64.b64decode(state))
    if sys.byteorder == "big":
        packed.byteswap()
    return packed
