"""Streaming breaker detectors — pure Python, no Django.

A detector watches one series (one metric, optionally one node), consumes its points in arrival
order and answers each with a `Verdict`. It knows nothing of severities, episodes or actions: the
engine (`breakers.detection.engine`) turns verdicts into edge-triggered findings.

Every detector
* updates in O(1) per point (amortised: windows evict what they added, and exact
  recomputations are paid for by the updates before them);
* keeps its whole state in plain JSON-able values: `to_state()` / `load_state()` round-trip
  exactly (floats survive `json` bit for bit; rolling windows travel as packed IEEE doubles,
  `breakers.detection.rolling.pack_floats`), so a restarted worker resumes where it stopped;
* ignores non-finite values in its statistics (the `non_finite` detector reports them).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# The shared vocabulary and the time-based detectors live in their own modules; this module stays
# the one import point (the engine and the tests import everything from here).
from breakers.detection.detector_base import (  # noqa: F401  (re-exported)
    ANOMALOUS,
    HEALTHY,
    HEALTHY_VERDICT,
    MAX_MAGNITUDE,
    PENDING,
    PENDING_VERDICT,
    UNKNOWN,
    UNKNOWN_VERDICT,
    Detector,
    Sample,
    Verdict,
    format_close,
    format_duration,
    format_number,
    is_usable,
    require,
    validate,
)
from breakers.detection.detectors_time import (  # noqa: F401  (re-exported)
    NodeFailureConfig,
    NodeFailureDetector,
    SilenceConfig,
    SilenceDetector,
    WatchdogDetector,
)
from breakers.detection.rolling import RollingStats  # noqa: F401  (re-exported)
from breakers.monitoring.dcgm_detectors import (  # DCGM's semantics (docs/monitoring.md)
    CounterRiseDetector,
    XidChangeDetector,
)


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
        validate(self, sigma_floor_rel="num>=0", sigma_floor_abs="num>0")


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
        require(
            (self.window is None) != (self.window_seconds is None),
            "give exactly one of window (points) or window_seconds",
        )
        validate(
            self,
            k="num>0",
            window="int>=2?",
            window_seconds="num>0?",
            min_points="int>=2?",
            sustain_points="int>=1",
            sustain_seconds="num>=0",
            grace_points="int>=0",
            max_freeze_points="int>=1?",
            max_freeze_seconds="num>0?",
        )
        require(
            self.direction in ("above", "below", "both"), "direction must be above, below or both"
        )
        require(self.baseline in ("absorb", "freeze"), "baseline must be absorb or freeze")

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
    state_fields = (
        "stats",
        "run_len",
        "run_gap",
        "run_step",
        "run_time",
        "frozen_points",
        "frozen_time",
    )

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
        require(
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
        require(self.above is not None or self.below is not None, "give above and/or below")
        validate(self, above="num?", below="num?")
        require(isinstance(self.inclusive, bool), "inclusive must be true or false")


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
        validate(self, window="int>=2", windows="int>=1", min_rise_se="num>=0")


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
    describe_reads_state = True  # the window means so far
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
            self.run_step, self.run_time = int(first_step), first_time
        self.rises += 1
        if self.rises < cfg.windows:
            return PENDING_VERDICT
        return Verdict(
            ANOMALOUS, threshold, self.run_step, self.run_time, prev[1], score=float(self.rises)
        )

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        means = " → ".join(format_number(m) for m in self.means)
        return (
            f"{metric} rose over {int(verdict.score or 0)} consecutive "
            f"{self.config.window}-step windows since step {verdict.since_step} "
            f"(window means {means})"
        )


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
        XidChangeDetector,
        CounterRiseDetector,
        WatchdogDetector,
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
