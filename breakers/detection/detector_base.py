"""The detectors' common vocabulary — pure Python, no Django.

Verdict states, the `Verdict` record, the `Detector` base class with its generic JSON
(de)serialisation, parameter validation and the number/duration formatting used in alert
descriptions. `breakers.detection.detectors` (value detectors) and
`breakers.detection.detectors_time` (silence,
node failures) both build on it; `breakers.detection.detectors` re-exports everything, so callers
import
from there only.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from breakers.detection.rolling import RollingStats
from core.nonfinite import spell

ANOMALOUS = "anomalous"  # the condition holds: open (or keep open) an episode
PENDING = "pending"  # not (yet) anomalous, but not healthy either: do not count towards a clear
HEALTHY = "healthy"  # the condition does not hold: counts towards clearing an open episode
UNKNOWN = "unknown"  # no opinion (warm-up, a value the detector ignores, mid-window)

# Statistics square their inputs; beyond this magnitude the squares overflow, so such values
# are treated like non-finite ones (excluded) rather than turning the sums into inf/NaN.
MAX_MAGNITUDE = 1e150


class Sample(Protocol):
    """What a detector reads from a point (``breakers.detection.engine.Point`` satisfies it)."""

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
    return f"{value:.4g}" if math.isfinite(value) else spell(value)


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


class Detector:
    """Base class: one series' detector. Subclasses set `kind`, `Config` and `state_fields`.

    State is the attributes named in `state_fields` (numbers, lists, deques, RollingStats);
    the generic `to_state` / `load_state` below turn them into plain JSON-able values and back.
    """

    kind: ClassVar[str] = ""
    time_based: ClassVar[bool] = False  # True: the engine must call tick(now) on it
    # True: `describe` reads the detector's state, so it must be called as the verdict is given.
    describe_reads_state: ClassVar[bool] = False
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


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


CHECKS = {
    "int>=0": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "int>=1": (lambda v: is_int(v) and v >= 1, "an integer >= 1"),
    "int>=2": (lambda v: is_int(v) and v >= 2, "an integer >= 2"),
    "num": (is_number, "a finite number"),
    "num>=0": (lambda v: is_number(v) and v >= 0, "a number >= 0"),
    "num>0": (lambda v: is_number(v) and v > 0, "a number > 0"),
}


def validate(config: Any, **checks: str) -> None:
    """Check config fields against `CHECKS` names; a trailing '?' allows None."""
    for name, check in checks.items():
        value = getattr(config, name)
        if check.endswith("?") and value is None:
            continue
        test, wanted = CHECKS[check.rstrip("?")]
        require(test(value), f"{name} must be {wanted}")
