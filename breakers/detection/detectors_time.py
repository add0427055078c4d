"""Time-based streaming detectors — pure Python, no Django.

Silence (a metric that stopped arriving) and node-failure counts (distinct nodes failing within
a time window). Both answer `tick(now)` as well as points, so the engine calls them periodically
even when nothing arrives (`time_based = True`). Registered in
`breakers.detection.detectors.DETECTORS`.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from breakers.detection.detector_base import (
    ANOMALOUS,
    HEALTHY_VERDICT,
    UNKNOWN_VERDICT,
    Detector,
    Sample,
    Verdict,
    format_duration,
    require,
    validate,
)


@dataclass(frozen=True)
class SilenceConfig:
    timeout: float | None = None  # fixed timeout in seconds ...
    timeout_factor: float | None = None  # ... or this many times the measured point interval
    min_timeout: float = 0.0  # bounds of a factor-based timeout
    max_timeout: float | None = None

    def __post_init__(self) -> None:
        require(
            (self.timeout is None) != (self.timeout_factor is None),
            "give exactly one of timeout or timeout_factor",
        )
        validate(
            self,
            timeout="num>0?",
            timeout_factor="num>0?",
            min_timeout="num>=0",
            max_timeout="num>0?",
        )


class SilenceDetector(Detector):
    """A metric that stopped arriving. Points only refresh it; `tick(now)` judges.

    With `timeout_factor` the timeout follows the series' own cadence (docs/design.md: a
    heartbeat timeout of several measured step times). The interval is an exponential moving
    average (α = 0.2); each sample is capped at 10× the current average so one long pause (the
    job was paused on purpose) does not inflate the timeout for the next hundred points. Until
    two points have been seen a factor-based timeout falls back to `min_timeout` (if set).
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
        validate(self, min_nodes="int>=1", window_seconds="num>0", failure_above="num")


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
        return Verdict(
            ANOMALOUS,
            float(self.config.min_nodes),
            first_step,
            first_time,
            observed=float(len(latest)),
            nodes=tuple(sorted(latest)),
        )

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


@dataclass(frozen=True)
class WatchdogConfig:
    """The watchdog's rule has no parameters: its deadline is the job's (heartbeat timeout)."""


class WatchdogDetector(Detector):
    """A rule judged by the control plane's watchdog, not on points: the heartbeat timeout
    (``breakers.control.heartbeats``). Its row in a team's rule set carries what a team may
    choose of it (shadow mode); the engine never finds anything with it."""

    kind = "watchdog"
    Config = WatchdogConfig

    def observe(self, point: Sample) -> Verdict:
        return UNKNOWN_VERDICT

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        return f"{metric}: judged by the watchdog"
