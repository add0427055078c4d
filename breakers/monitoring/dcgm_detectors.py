"""The detectors that read DCGM series as DCGM means them — pure Python, no Django.

``xid_change``: the XID gauge holds the last XID, so an error is a change to a new non-zero
value (filtered by ``values`` or ``exclude``); the same value again is healthy, so the episode
clears after ``clear_after`` points. ``counter_rise``: a counter that rose; a drop is a reset.
Both keep only the previous value as state (registered in ``breakers.detection.detectors``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from breakers.detection.detector_base import (
    ANOMALOUS,
    HEALTHY_VERDICT,
    UNKNOWN_VERDICT,
    Detector,
    Sample,
    Verdict,
    format_number,
    is_int,
    require,
)
from breakers.monitoring.dcgm import is_new_xid, is_rise, xid_meaning


@dataclass(frozen=True)
class XidChangeConfig:
    values: list[int] = field(default_factory=list)  # only these XIDs (empty: any)
    exclude: list[int] = field(default_factory=list)  # never these

    def __post_init__(self) -> None:
        for name in ("values", "exclude"):
            codes = getattr(self, name)
            require(
                isinstance(codes, list) and all(is_int(c) and c > 0 for c in codes),
                f"{name} must be a list of XID numbers",
            )


class XidChangeDetector(Detector):
    kind = "xid_change"
    Config = XidChangeConfig
    state_fields = ("previous",)

    def __init__(self, config: XidChangeConfig) -> None:
        super().__init__(config)
        self.previous: float | None = None

    def observe(self, point: Sample) -> Verdict:
        value = point.value
        if not math.isfinite(value):
            return UNKNOWN_VERDICT  # a gap in the gauge is no new XID, nor a clear
        new, self.previous = is_new_xid(self.previous, value), value
        cfg = self.config
        wanted = (not cfg.values or int(value) in cfg.values) and int(value) not in cfg.exclude
        if new and wanted:
            return Verdict(ANOMALOUS, None, point.step, point.time, observed=value)
        return HEALTHY_VERDICT

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        return f"{metric} reports XID {format_number(value)}: {xid_meaning(value)}"


@dataclass(frozen=True)
class NoParams:
    """counter_rise has no parameters."""


class CounterRiseDetector(Detector):
    kind = "counter_rise"
    Config = NoParams
    state_fields = ("previous",)

    def __init__(self, config: NoParams) -> None:
        super().__init__(config)
        self.previous: float | None = None

    def observe(self, point: Sample) -> Verdict:
        value = point.value
        if not math.isfinite(value):
            return UNKNOWN_VERDICT
        previous, self.previous = self.previous, value
        if is_rise(previous, value):
            assert previous is not None
            return Verdict(ANOMALOUS, previous, point.step, point.time, observed=value)
        return HEALTHY_VERDICT

    def describe(self, metric: str, value: float, verdict: Verdict) -> str:
        before = format_number(verdict.threshold if verdict.threshold is not None else 0.0)
        return f"{metric} rose from {before} to {format_number(value)}"
