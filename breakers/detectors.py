"""Streaming breaker detectors — pure Python, no Django.

A detector watches one series (one metric, optionally one node), consumes its points in arrival
order and answers each with a `Verdict`. It knows nothing of severities, episodes or actions: the
engine (`breakers.engine`) turns verdicts into edge-triggered findings.

Every detector
* updates in O(1) per point (amortised: windows evict what they added, and exact
  recomputations are paid for by the updates before them);
* keeps its whole state in plain JSON-able values: `to_state()` / `load_state()` round-trip
  exactly (floats survive `json` bit for bit), so a restarted worker resumes where it stopped;
* ignores non-finite values in its statistics (the `non_finite` detector reports them).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

ANOMALOUS = "anomalous"  # the condition holds: open (or keep open) an episode
PENDING = "pending"  # not (yet) anomalous, but not healthy either: do not count towards a clear
HEALTHY = "healthy"  # the condition does not hold: counts towards clearing an open episode
UNKNOWN = "unknown"  # no opinion (warm-up, a value the detector ignores, mid-window)

# Statistics square their inputs; beyond this magnitude the squares overflow, so such values
# are treated like non-finite ones (excluded) rather than turning the sums into inf/NaN.
MAX_MAGNITUDE = 1e150


class Sample(Protocol):
    """What a detector reads from a point (``breakers.engine.Point`` satisfies it)."""

    name: str
    step: int
    time: float
    value: float
    node: str | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """A detector's answer for one point or tick."""

    state: str
    threshold: float | None = None  # the boundary that was crossed, as a number
    since_step: int | None = None  # first anomalous step of the underlying condition
    since_time: float | None = None
    center: float | None = None  # baseline mean (deviation) / previous window mean (rising)
    spread: float | None = None  # effective σ used (deviation)
    score: float | None = None  # z-score (deviation); detector-specific otherwise
    observed: float | None = None  # the judged quantity when it is not the point's value
    nodes: tuple[str, ...] = ()  # nodes implicated (node-failure count)


HEALTHY_VERDICT = Verdict(HEALTHY)
UNKNOWN_VERDICT = Verdict(UNKNOWN)
PENDING_VERDICT = Verdict(PENDING)


def is_usable(value: float) -> bool:
    """True when a value may enter statistics (finite and not absurdly large)."""
    return -MAX_MAGNITUDE < value < MAX_MAGNITUDE  # False for NaN and ±Inf too


def format_number(value: float) -> str:
    """Short human form of a metric value; non-finite values spelled as the agent protocol does."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return f"{value:.4g}"


def format_close(value: float, sigma: float, reference: float) -> str:
    """Format a value with enough digits to show differences of order `sigma` next to
    `reference` (1e4 ± 1e-6 must not print as "1e+04 is 12σ above 1e+04")."""
    scale = max(abs(value), abs(reference))
    if not (math.isfinite(value) and sigma > 0 and scale > sigma):
        return format_number(value)
    digits = min(17, max(4, 2 + math.ceil(math.log10(scale / sigma))))
    return f"{value:.{digits}g}"


def format_duration(seconds: float) -> str:
    """'45 s', '10m 03s', '2h 05m'."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


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
            "values": list(self.values),
            "times": list(self.times),
            "sums": [self.shift, self.s1, self.s2, self.peak, self.ops],
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.values = deque(float(v) for v in state["values"])
        self.times = deque(float(t) for t in state["times"])
        shift, s1, s2, peak, ops = state["sums"]
        self.shift, self.s1, self.s2, self.peak = float(shift), float(s1), float(s2), float(peak)
        self.ops = int(ops)


class Detector:
    """Base class: one series' detector. Subclasses set `kind`, `Config` and `state_fields`.

    State is the attributes named in `state_fields` (numbers, lists, deques, RollingStats);
    the generic `to_state` / `load_state` below turn them into plain JSON-able values and back.
    """

    kind: ClassVar[str] = ""
    time_based: ClassVar[bool] = False  # True: the engine must call tick(now) on it
    Config: ClassVar[type] = object
    state_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Any) -> None:
        self.config = config

    def observe(self, point: Sample) -> Verdict:
        raise NotImplementedError

    def tick(self, now: float) -> Verdict:
        """Time-based check with no new point; only silence and node-failure answer."""
        return UNKNOWN_VERDICT

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        raise NotImplementedError

    def to_state(self) -> dict[str, Any]:
        return {name: _encode(getattr(self, name)) for name in self.state_fields}

    def load_state(self, state: Mapping[str, Any]) -> None:
        for name in self.state_fields:
            current, value = getattr(self, name), state[name]
            if isinstance(current, RollingStats):
                current.load_state(value)
            elif isinstance(current, deque):
                setattr(self, name, deque(value, maxlen=current.maxlen))
            else:
                setattr(self, name, list(value) if isinstance(value, list) else value)
        self._after_load()

    def _after_load(self) -> None:
        """Rebuild derived (unserialised) structures."""


def _encode(value: Any) -> Any:
    if isinstance(value, RollingStats):
        return value.to_state()
    if isinstance(value, (deque, list, tuple)):
        return [_encode(item) for item in value]
    return value


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_CHECKS = {
    "int>=0": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "int>=1": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "int>=2": (lambda v: _is_int(v) and v >= 2, "an integer >= 2"),
    "num": (_is_number, "a finite number"),
    "num>=0": (lambda v: _is_number(v) and v >= 0, "a number >= 0"),
    "num>0": (lambda v: _is_number(v) and v > 0, "a number > 0"),
}


def _validate(config: Any, **checks: str) -> None:
    """Check config fields against `_CHECKS` names; a trailing '?' allows None."""
    for name, check in checks.items():
        value = getattr(config, name)
        if check.endswith("?") and value is None:
            continue
        test, wanted = _CHECKS[check.rstrip("?")]
        _require(test(value), f"{name} must be {wanted}")


@dataclass(frozen=True)
class SigmaFloor:
    """σ floor rule shared by deviation and rising detectors.

    A flat series has σ = 0, and any later change would be "infinitely many σ" away. The
    effective σ is therefore max(σ, sigma_floor_rel·|mean|, sigma_floor_abs): with the default
    1e-4 a series flat to four significant digits must move by more than k·0.01 % before it
    deviates (float32 metrics alone jitter at ~1e-7 relative), and a flat zero series needs
    the absolute floor.
    """

    sigma_floor_rel: float = 1e-4
    sigma_floor_abs: float = 1e-12

    def floored(self, sigma: float, mean: float) -> float:
        return max(sigma, self.sigma_floor_rel * abs(mean), self.sigma_floor_abs)

    def _check_floor(self) -> None:
        _validate(self, sigma_floor_rel="num>=0", sigma_floor_abs="num>0")


@dataclass(frozen=True)
class DeviationConfig(SigmaFloor):
    """Parameters of `deviation` / `sustained` (window in points *or* seconds)."""

    k: float = 3.0  # deviation threshold in (effective) σ
    window: int | None = None  # baseline = the last `window` finite points ...
    window_seconds: float | None = None  # ... or the finite points of the last T seconds
    min_points: int | None = None  # warm-up; default: `window`, or 20 for a time window
    direction: str = "both"  # "above" | "below" | "both"
    sustain_points: int = 1  # consecutive deviating points before the condition holds ...
    sustain_seconds: float = 0.0  # ... and for at least this long (first to current point)
    grace_points: int = 0  # non-deviating points tolerated inside a run without breaking it
    baseline: str = "absorb"  # "absorb" | "freeze": see DeviationDetector
    max_freeze_points: int | None = None  # re-baseline after a freeze this long ...
    max_freeze_seconds: float | None = None  # ... (None: freeze for as long as it deviates)

    def __post_init__(self) -> None:
        self._check_floor()
        _require((self.window is None) != (self.window_seconds is None),
                 "give exactly one of window (points) or window_seconds")
        _validate(self, k="num>0", window="int>=2?", window_seconds="num>0?",
                  min_points="int>=2?", sustain_points="int>=1", sustain_seconds="num>=0",
                  grace_points="int>=0", max_freeze_points="int>=1?",
                  max_freeze_seconds="num>0?")
        _require(self.direction in ("above", "below", "both"),
                 "direction must be above, below or both")
        _require(self.baseline in ("absorb", "freeze"), "baseline must be absorb or freeze")

    @property
    def warmup(self) -> int:
        if self.min_points is not None:
            return self.min_points
        return self.window if self.window is not None else 20


class DeviationDetector(Detector):
    """|x − mean| > k·σ against a sliding baseline, optionally sustained for a while.

    The point is judged against the baseline *before* it is added. Warm-up (fewer than
    `min_points` baseline points) answers UNKNOWN and only fills the baseline.

    Baseline contamination (`baseline`):
    * "absorb" (default of `deviation`): every finite point enters the baseline. Right for
      short notices — the baseline follows level changes, and a spike only widens σ briefly.
    * "freeze" (default of `sustained`): while the series deviates in the watched direction
      the baseline is frozen — the deviating points are not added and, for a time window,
      nothing expires either. Otherwise a real divergence would be absorbed within a window
      (a 200-point window has swallowed a level shift after ~200 points) and stop counting as
      a deviation long before "sustained for 10 minutes" is reached. Points that deviate in
      the *unwatched* direction are absorbed, so a welcome drop of the loss never freezes the
      baseline of an "above" rule. A freeze ends at the first non-deviating point (the window
      then expires normally and may fall back to warm-up after a long freeze), or, when
      `max_freeze_points` / `max_freeze_seconds` is set, after that long: the baseline is then
      discarded and re-learned from the new level, so a permanent, benign level change
      eventually clears instead of staying "deviating" forever.
    """

    kind = "deviation"
    Config = DeviationConfig
    state_fields = ("stats", "run_len", "run_gap", "run_step", "run_time", "frozen_points",
                    "frozen_time")

    def __init__(self, config: DeviationConfig) -> None:
        super().__init__(config)
        self.stats = RollingStats(config.window, config.window_seconds)
        self.min_points = config.warmup
        self.freeze = config.baseline == "freeze"
        self.run_len = 0  # deviating points in the current run
        self.run_gap = 0  # consecutive non-deviating points inside the run (grace)
        self.run_step = 0
        self.run_time = 0.0
        self.frozen_points = 0  # > 0 while the baseline is frozen
        self.frozen_time = 0.0

    def observe(self, point: Sample) -> Verdict:
        x = point.value
        if not is_usable(x):
            return UNKNOWN_VERDICT  # reported by `non_finite`; never enters the statistics
        stats = self.stats
        if not self.frozen_points:
            stats.expire(point.time)
        if stats.count < self.min_points:
            stats.add(point.time, x)
            return UNKNOWN_VERDICT
        mean = stats.mean()
        sigma = self.config.floored(stats.std(), mean)
        z = (x - mean) / sigma
        direction = self.config.direction
        if direction == "both":
            deviating = abs(z) > self.config.k
        else:
            deviating = (z > self.config.k) if direction == "above" else (z < -self.config.k)
        if not deviating:
            if self.frozen_points:
                self.frozen_points = 0
                stats.expire(point.time)
            stats.add(point.time, x)
            return self._continue_or_break_run()
        verdict = self._extend_run(point, mean, sigma, z)
        if self.freeze:
            self._hold_baseline(point)
        else:
            stats.add(point.time, x)
        return verdict

    def _extend_run(self, point: Sample, mean: float, sigma: float, z: float) -> Verdict:
        if self.run_len == 0:
            self.run_step, self.run_time = point.step, point.time
        self.run_len += 1
        self.run_gap = 0
        cfg = self.config
        if self.run_len < cfg.sustain_points or point.time - self.run_time < cfg.sustain_seconds:
            return PENDING_VERDICT
        threshold = mean + cfg.k * sigma if z > 0 else mean - cfg.k * sigma
        return Verdict(ANOMALOUS, threshold, self.run_step, self.run_time, mean, sigma, z)

    def _continue_or_break_run(self) -> Verdict:
        if self.run_len and self.run_gap < self.config.grace_points:
            self.run_gap += 1
            return PENDING_VERDICT
        self.run_len = self.run_gap = 0
        return HEALTHY_VERDICT

    def _hold_baseline(self, point: Sample) -> None:
        if not self.frozen_points:
            self.frozen_time = point.time
        self.frozen_points += 1
        cfg = self.config
        too_long = (
            cfg.max_freeze_points is not None and self.frozen_points > cfg.max_freeze_points
        ) or (
            cfg.max_freeze_seconds is not None
            and point.time - self.frozen_time > cfg.max_freeze_seconds
        )
        if too_long:
            # Re-baseline from the new level: warm-up starts again with this point.
            self.stats.clear()
            self.stats.add(point.time, point.value)
            self.frozen_points = 0
            self.run_len = self.run_gap = 0

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        cfg = self.config
        z = verdict.score or 0.0
        span = f"{cfg.window}-step" if cfg.window else f"{format_duration(cfg.window_seconds)}"
        mean, sigma = verdict.center or 0.0, verdict.spread or 0.0
        text = (
            f"{metric} {format_close(value, sigma, mean)} is {abs(z):.1f}σ "
            f"{'above' if z > 0 else 'below'} its {span} mean {format_close(mean, sigma, mean)} "
            f"(σ {sigma:.3g}, threshold {format_close(verdict.threshold or 0.0, sigma, mean)})"
        )
        if cfg.sustain_points > 1 or cfg.sustain_seconds > 0:
            text += f", beyond {cfg.k:g}σ since step {verdict.since_step}"
        return text

class SustainedDeviationDetector(DeviationDetector):
    """`deviation` that must last (sustain_seconds and/or sustain_points) and freezes its
    baseline by default (see DeviationDetector for why)."""

    kind = "sustained"

    @staticmethod
    def prepare(params: Mapping[str, Any]) -> dict[str, Any]:
        prepared = {"baseline": "freeze", **params}
        _require(
            prepared.get("sustain_seconds", 0) or prepared.get("sustain_points", 1) != 1,
            "sustained needs sustain_seconds > 0 or sustain_points > 1",
        )
        return prepared


@dataclass(frozen=True)
class NoConfig:
    """Detectors without parameters."""


class NonFiniteDetector(Detector):
    """NaN, +Inf or −Inf values. Every finite value is healthy."""

    kind = "non_finite"
    Config = NoConfig

    def observe(self, point: Sample) -> Verdict:
        if math.isfinite(point.value):
            return HEALTHY_VERDICT
        return Verdict(ANOMALOUS, since_step=point.step, since_time=point.time)

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        return f"{metric} is {format_number(value)} at step {verdict.since_step}"


@dataclass(frozen=True)
class ThresholdConfig:
    above: float | None = None  # fires when value > above (>= when inclusive)
    below: float | None = None  # fires when value < below (<= when inclusive)
    inclusive: bool = False

    def __post_init__(self) -> None:
        _require(self.above is not None or self.below is not None, "give above and/or below")
        _validate(self, above="num?", below="num?")
        _require(isinstance(self.inclusive, bool), "inclusive must be true or false")


class ThresholdDetector(Detector):
    """Plain threshold. +Inf is above any bound and −Inf below; NaN has no opinion."""

    kind = "threshold"
    Config = ThresholdConfig

    def observe(self, point: Sample) -> Verdict:
        x = point.value
        cfg = self.config
        if math.isnan(x):
            return UNKNOWN_VERDICT
        above, below = cfg.above, cfg.below
        if above is not None and (x > above or (cfg.inclusive and x == above)):
            return Verdict(ANOMALOUS, above, point.step, point.time, score=1.0)
        if below is not None and (x < below or (cfg.inclusive and x == below)):
            return Verdict(ANOMALOUS, below, point.step, point.time, score=-1.0)
        return HEALTHY_VERDICT

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        side = "above" if (verdict.score or 0) > 0 else "below"
        bound = format_number(verdict.threshold or 0.0)
        return f"{metric} {format_number(value)} is {side} the threshold {bound}"


@dataclass(frozen=True)
class RisingConfig(SigmaFloor):
    window: int = 50  # points per (tumbling) window
    windows: int = 5  # K: consecutive rising windows that make the condition
    min_rise_se: float = 1.0  # a rise counts only above this many standard errors

    def __post_init__(self) -> None:
        self._check_floor()
        _validate(self, window="int>=2", windows="int>=1", min_rise_se="num>=0")


class RisingDetector(Detector):
    """Window means strictly rising over K consecutive tumbling windows of W points.

    On a noisy plateau consecutive window means rise by pure chance with probability
    1/(K+1)! — once in 720 windows for K = 5, far too often for an L3 breaker. A rise
    therefore only counts when it exceeds `min_rise_se` standard errors of the difference of
    the two means, sqrt(var_a/n_a + var_b/n_b) (floored like σ, see SigmaFloor). Within a
    window mean and variance are accumulated with Welford's update (add-only, stable).
    Verdicts come when a window completes; points inside a window answer UNKNOWN.
    """

    kind = "rising"
    Config = RisingConfig
    state_fields = ("cur", "prev", "rises", "run_step", "run_time", "means")

    def __init__(self, config: RisingConfig) -> None:
        super().__init__(config)
        self.cur = [0, 0.0, 0.0, 0, 0.0]  # n, mean, m2, first step, first time
        self.prev: list[float] | None = None  # n, mean, variance of the last full window
        self.rises = 0
        self.run_step = 0
        self.run_time = 0.0
        self.means: deque[float] = deque(maxlen=config.windows + 1)

    def observe(self, point: Sample) -> Verdict:
        x = point.value
        if not is_usable(x):
            return UNKNOWN_VERDICT
        cur = self.cur
        if cur[0] == 0:
            cur[3], cur[4] = point.step, point.time
        cur[0] += 1
        delta = x - cur[1]
        cur[1] += delta / cur[0]
        cur[2] += delta * (x - cur[1])
        if cur[0] < self.config.window:
            return UNKNOWN_VERDICT
        return self._close_window()

    def _close_window(self) -> Verdict:
        n, mean, m2, first_step, first_time = self.cur
        variance = m2 / n
        self.cur = [0, 0.0, 0.0, 0, 0.0]
        self.means.append(mean)
        prev, self.prev = self.prev, [n, mean, variance]
        if prev is None:
            return UNKNOWN_VERDICT
        cfg = self.config
        se = math.sqrt(variance / n + prev[2] / prev[0])
        threshold = prev[1] + cfg.min_rise_se * cfg.floored(se, prev[1])
        if not (mean > threshold and mean > prev[1]):
            self.rises = 0
            return HEALTHY_VERDICT
        if self.rises == 0:
            self.run_step, self.run_time = first_step, first_time
        self.rises += 1
        if self.rises < cfg.windows:
            return PENDING_VERDICT
        return Verdict(ANOMALOUS, threshold, self.run_step, self.run_time, prev[1],
                       score=float(self.rises))

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        means = " → ".join(format_number(m) for m in self.means)
        return (
            f"{metric} rose over {int(verdict.score or 0)} consecutive "
            f"{self.config.window}-step windows since step {verdict.since_step} "
            f"(window means {means})"
        )


@dataclass(frozen=True)
class SilenceConfig:
    timeout: float | None = None  # fixed timeout in seconds ...
    timeout_factor: float | None = None  # ... or this many times the measured point interval
    min_timeout: float = 0.0  # bounds of a factor-based timeout
    max_timeout: float | None = None

    def __post_init__(self) -> None:
        _require((self.timeout is None) != (self.timeout_factor is None),
                 "give exactly one of timeout or timeout_factor")
        _validate(self, timeout="num>0?", timeout_factor="num>0?", min_timeout="num>=0",
                  max_timeout="num>0?")


class SilenceDetector(Detector):
    """A metric that stopped arriving. Points only refresh it; `tick(now)` judges.

    With `timeout_factor` the timeout follows the series' own cadence (SPEC: heartbeat timeout
    5–10× the measured step time). The interval is an exponential moving average (α = 0.2);
    each sample is capped at 10× the current average so one long pause (the job was paused
    on purpose) does not inflate the timeout for the next hundred points. Until two points
    have been seen a factor-based timeout falls back to `min_timeout` (if set).
    `now` must be on the same clock as the points' times. A metric never seen is never silent.
    """

    kind = "silence"
    time_based = True
    Config = SilenceConfig
    state_fields = ("last_time", "last_step", "interval")
    EWMA_ALPHA = 0.2

    def __init__(self, config: SilenceConfig) -> None:
        super().__init__(config)
        self.last_time: float | None = None
        self.last_step = 0
        self.interval: float | None = None

    def observe(self, point: Sample) -> Verdict:
        if self.last_time is not None and point.time > self.last_time:
            sample = point.time - self.last_time
            if self.interval is None:
                self.interval = sample
            else:
                sample = min(sample, 10 * self.interval)
                self.interval += self.EWMA_ALPHA * (sample - self.interval)
        if self.last_time is None or point.time >= self.last_time:
            self.last_time, self.last_step = point.time, point.step
        return HEALTHY_VERDICT

    def timeout(self) -> float | None:
        cfg = self.config
        if cfg.timeout is not None:
            return cfg.timeout
        if self.interval is None:
            return cfg.min_timeout or None
        limit = max(cfg.timeout_factor * self.interval, cfg.min_timeout)
        return limit if cfg.max_timeout is None else min(limit, cfg.max_timeout)

    def tick(self, now: float) -> Verdict:
        timeout = self.timeout()
        if self.last_time is None or timeout is None:
            return UNKNOWN_VERDICT
        silent_for = now - self.last_time
        if silent_for <= timeout:
            return UNKNOWN_VERDICT
        return Verdict(ANOMALOUS, timeout, self.last_step, self.last_time, observed=silent_for)

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        return (
            f"{metric} silent for {format_duration(verdict.observed or 0.0)} "
            f"(timeout {format_duration(verdict.threshold or 0.0)}; "
            f"last point at step {verdict.since_step})"
        )


@dataclass(frozen=True)
class NodeFailureConfig:
    min_nodes: int = 2  # fire when at least this many distinct nodes failed ...
    window_seconds: float = 60.0  # ... within this many seconds
    failure_above: float = 0.0  # a point reports a failure when its value is above this

    def __post_init__(self) -> None:
        _validate(self, min_nodes="int>=1", window_seconds="num>0", failure_above="num")


class NodeFailureDetector(Detector):
    """Distinct nodes reporting a failure within a time window (≥ min_nodes → anomalous).

    The failing node is the point's `node`, or its metric name when it has none (so
    `node.7.down`-style metrics work too). Events sit in a time-ordered deque and a map keeps
    each node's latest failure; expiring from the front keeps the work O(1) amortised.
    Point times are expected to be non-decreasing.
    """

    kind = "node_failures"
    time_based = True
    Config = NodeFailureConfig
    state_fields = ("events",)

    def __init__(self, config: NodeFailureConfig) -> None:
        super().__init__(config)
        self.events: deque[tuple[float, int, str]] = deque()
        self.latest: dict[str, float] = {}

    def observe(self, point: Sample) -> Verdict:
        x = point.value
        if not math.isnan(x) and x > self.config.failure_above:
            node = point.node or point.name
            self.events.append((point.time, point.step, node))
            self.latest[node] = max(point.time, self.latest.get(node, point.time))
        return self.tick(point.time)

    def tick(self, now: float) -> Verdict:
        cutoff = now - self.config.window_seconds
        events, latest = self.events, self.latest
        while events and events[0][0] <= cutoff:
            time, _, node = events.popleft()
            if latest.get(node) == time:
                del latest[node]
        if len(latest) < self.config.min_nodes:
            return HEALTHY_VERDICT
        first_time, first_step, _ = events[0]
        return Verdict(ANOMALOUS, float(self.config.min_nodes), first_step, first_time,
                       observed=float(len(latest)), nodes=tuple(sorted(latest)))

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        nodes = ", ".join(verdict.nodes)
        return (
            f"{len(verdict.nodes)} nodes reported {metric} within "
            f"{format_duration(self.config.window_seconds)} ({nodes}); "
            f"threshold {self.config.min_nodes}"
        )

    def _after_load(self) -> None:
        self.latest = {}
        for time, _, node in self.events:
            self.latest[node] = max(time, self.latest.get(node, time))


DETECTORS: dict[str, type[Detector]] = {
    cls.kind: cls
    for cls in (
        DeviationDetector,
        SustainedDeviationDetector,
        NonFiniteDetector,
        ThresholdDetector,
        RisingDetector,
        SilenceDetector,
        NodeFailureDetector,
    )
}


def make_config(kind: str, params: Mapping[str, Any]) -> Any:
    """Validate `params` for detector `kind` and return its config; ValueError when invalid."""
    cls = DETECTORS.get(kind)
    if cls is None:
        raise ValueError(f"unknown detector kind {kind!r}; known: {', '.join(sorted(DETECTORS))}")
    if cls is SustainedDeviationDetector:
        params = SustainedDeviationDetector.prepare(params)
    try:
        return cls.Config(**params)
    except TypeError as error:  # unknown or misspelt parameter
        raise ValueError(f"{kind}: {error}") from None


def build_detector(kind: str, params: Mapping[str, Any]) -> Detector:
    """A fresh detector of `kind` configured by `params` (a plain dict, e.g. from JSON)."""
    config = make_config(kind, params)
    return DETECTORS[kind](config)


def config_as_dict(config: Any) -> dict[str, Any]:
    """The full configuration with defaults filled in (for display and fingerprints)."""
    return asdict(config)
