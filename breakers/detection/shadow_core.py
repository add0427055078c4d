"""How a shadow rule compares with what really happened — pure, no Django.

The question a team asks before promoting a rule: had it been live, how often would it have
fired, how often would that have been for a real incident, how many of the real incidents
would it have caught, and how much earlier or later than the alarm that really came?

* A would-have-fired event is *inside* an incident of its job when it fired between the
  incident's first anomalous point minus ``LEAD_SECONDS`` and the incident's end (open: no end).
  The lead lets a rule that sees trouble coming (a tighter threshold, a rising trend) count
  as catching the incident early rather than as a false alarm.
* An incident is *caught* when at least one event of the rule is inside it; its earliest such
  event is compared with the real alarm (the incident's first alert): negative seconds and
  steps are that much earlier.
* Only incidents opened while the rule was in shadow mode count as ones it could have caught
  (``shadow_intervals``, from the rule set's versions): a rule put in shadow yesterday did
  not miss last month's incidents.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LEAD_SECONDS = 1800.0

__all__ = [
    "Comparison",
    "Firing",
    "LEAD_SECONDS",
    "RealIncident",
    "compare",
    "in_intervals",
    "shadow_intervals",
]


@dataclass(frozen=True)
class Firing:
    job_id: int
    fired_at: float  # epoch seconds, the job's metric clock
    fired_step: int


@dataclass(frozen=True)
class RealIncident:
    id: int
    job_id: int
    first_at: float  # the first anomalous point
    alarm_at: float  # the first alert really raised
    alarm_step: int | None
    end_at: float | None  # resolved; None while open


@dataclass(frozen=True)
class Comparison:
    fired: int
    jobs: int
    inside: int  # events inside a real incident of their job
    outside: int  # events no real incident explains
    incidents: int  # incidents it could have caught (opened while it was in shadow)
    caught: int
    median_lead_seconds: float | None  # earliest event − real alarm; negative: earlier
    median_lead_steps: float | None
    caught_ids: tuple[int, ...] = ()


def _inside(firing: Firing, incident: RealIncident, lead: float) -> bool:
    end = math.inf if incident.end_at is None else incident.end_at
    return firing.job_id == incident.job_id and incident.first_at - lead <= firing.fired_at <= end


def _median(values: Sequence[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    return (ordered[middle - 1] + ordered[middle]) / 2.0


def compare(
    firings: Iterable[Firing],
    incidents: Iterable[RealIncident],
    lead_seconds: float = LEAD_SECONDS,
) -> Comparison:
    """The rule's events against the real incidents (both of the same team and period)."""
    events, real = list(firings), list(incidents)
    inside = sum(1 for f in events if any(_inside(f, i, lead_seconds) for i in real))
    leads_s: list[float] = []
    leads_steps: list[float] = []
    caught: list[int] = []
    for incident in real:
        matching = [f for f in events if _inside(f, incident, lead_seconds)]
        if not matching:
            continue
        first = min(matching, key=lambda f: (f.fired_at, f.fired_step))
        caught.append(incident.id)
        leads_s.append(first.fired_at - incident.alarm_at)
        if incident.alarm_step is not None:
            leads_steps.append(float(first.fired_step - incident.alarm_step))
    return Comparison(
        fired=len(events),
        jobs=len({f.job_id for f in events}),
        inside=inside,
        outside=len(events) - inside,
        incidents=len(real),
        caught=len(caught),
        median_lead_seconds=_median(leads_s),
        median_lead_steps=_median(leads_steps),
        caught_ids=tuple(caught),
    )


Interval = tuple[float, float | None]


def shadow_intervals(versions: Iterable[tuple[float, bool]]) -> list[Interval]:
    """When a rule was in shadow mode, from the rule set's versions in order: (when the version
    began, whether the rule was a shadow rule in it) → [start, end) intervals, the last one
    open (None) while it still is."""
    intervals: list[Interval] = []
    start: float | None = None
    for at, shadow in versions:
        if shadow and start is None:
            start = at
        elif not shadow and start is not None:
            intervals.append((start, at))
            start = None
    if start is not None:
        intervals.append((start, None))
    return intervals


def in_intervals(moment: float, intervals: Iterable[Interval]) -> bool:
    return any(start <= moment and (end is None or moment < end) for start, end in intervals)
