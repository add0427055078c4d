"""Measured durations of the alarm-to-brake chain, from an incident's timeline (pure, no Django).

The post-mortem writer's question is "how long did each link take?". Each link is measured
between two timeline rows, in seconds (wall clock) and in training steps (the job's own
clock), so a slow link shows both how long people waited and how much training ran meanwhile:

* detect      — first anomalous point → the first alert raised
* notify      — alert → first notification delivered (else first sent; else not measured);
  a page that failed reached nobody and ends nothing
* acknowledge — alert → first acknowledgement by a person
* escalate    — the first alert → the alert (or escalation) whose command stopped training
* brake       — that alert → training actually stopped: the confirmed checkpoint, or terminated
* recover     — training stopped → resumed

The chain adds up: detect + escalate + brake is the time from the first anomalous point to the
stop. Each link that starts at an alert starts at the alert that *caused* its end: the brake at
the alert (or the escalation of it) whose command stopped training, the acknowledgement at the
alert acknowledged; an L1 notice raised long before the L3 that braked shows in "escalate", not
in "brake". When the end row names no alert, the link starts at the episode's first alert.
``recover`` starts at the stop (not the alert) so the links do not count the same time twice.
Every link says which row started it and which ended it. Rows are taken in timeline order; an
end row is the first of its kinds after the start row.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

FIRST_ANOMALOUS_POINT = "first_anomalous_point"
ALERT_RAISED = "alert_raised"
NOTIFICATION_SENT = "notification_sent"
NOTIFICATION_DELIVERED = "notification_delivered"
ACKNOWLEDGED = "acknowledged"
CHECKPOINT_SAVED = "checkpoint_saved"
TERMINATED = "terminated"
RESUMED = "resumed"
SEVERITY_CHANGED = "severity_changed"

# The stop counts only once it is confirmed: a checkpoint saved (the agent's acknowledgement
# of checkpoint_and_pause) or the job terminated (by the agent or an out-of-band executor).
STOP_KINDS = (CHECKPOINT_SAVED, TERMINATED)


@dataclass(frozen=True)
class Row:
    """One timeline row as plain data (what the JSON export carries, too)."""

    kind: str
    at: datetime
    step: int | None = None
    actor_kind: str = "system"
    actor: str | None = None  # a person's username; None for the system and the agent
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    alert_id: int | None = None


@dataclass(frozen=True)
class LinkSpec:
    key: str
    label: str
    start: str  # "first" (the first anomalous point), "alert" or "stop"
    # Groups of end kinds in order of preference: the first group with a row after the start
    # ends the link (notify: a delivery, else a sending); within a group, the earliest row.
    ends: tuple[tuple[str, ...], ...]


LINKS: tuple[LinkSpec, ...] = (
    LinkSpec("detect", "Time to detect", "first", ((ALERT_RAISED,),)),
    LinkSpec(
        "notify", "Time to notify", "alert", ((NOTIFICATION_DELIVERED,), (NOTIFICATION_SENT,))
    ),
    LinkSpec("acknowledge", "Time to acknowledge", "alert", ((ACKNOWLEDGED,),)),
    # Ends at the brake's own start: measured in ``measure`` once the brake is.
    LinkSpec("escalate", "Time to the braking alert", "alert", ()),
    LinkSpec("brake", "Time to brake", "alert", (STOP_KINDS,)),
    LinkSpec("recover", "Time to recover", "stop", ((RESUMED,),)),
)
LINK_KEYS: tuple[str, ...] = tuple(spec.key for spec in LINKS)


def steps_phrase(steps: int | None) -> str:
    """ "40 steps", or, for a link that ends at an earlier step (a roll back went back past
    where training stopped), "157 steps rolled back"; "" when not measured."""
    if steps is None:
        return ""
    if steps < 0:
        return f"{-steps} steps rolled back"
    return f"{steps} steps"


@dataclass(frozen=True)
class Link:
    """One measured link; ``seconds`` None means "not measured" (an end row never came)."""

    key: str
    label: str
    seconds: float | None
    steps: int | None
    start_at: datetime | None
    end_at: datetime | None
    end_kind: str | None  # which row ended it (checkpoint_saved or terminated, …)
    start_kind: str | None = None  # which row started it (alert_raised, severity_changed, …)

    @property
    def measured(self) -> bool:
        return self.seconds is not None

    @property
    def steps_phrase(self) -> str:
        return steps_phrase(self.steps)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "seconds": self.seconds,
            "steps": self.steps,
            "start_at": _iso(self.start_at),
            "end_at": _iso(self.end_at),
            "end_kind": self.end_kind,
            "start_kind": self.start_kind,
        }


@dataclass(frozen=True)
class DeclaredSize:
    """The job's size (``incidents.models.JobSize``), as plain data: declared by a person, or
    reported by the job (``source``)."""

    nodes: int
    gpus_per_node: int
    source: str = "declared"

    @property
    def accelerators(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Durations:
    links: tuple[Link, ...]
    accelerator_hours: float | None  # first anomalous point → brake, at the job's size
    accelerators: int | None
    size_source: str | None = None  # "declared" or "reported"; None: no size known

    def link(self, key: str) -> Link:
        return next(link for link in self.links if link.key == key)

    @property
    def slowest(self) -> Link | None:
        """The measured link that took longest: the one a review looks at first."""
        measured = [link for link in self.links if link.seconds is not None]
        return max(measured, key=lambda link: link.seconds or 0.0, default=None)  # all measured

    def as_dict(self) -> dict[str, Any]:
        slowest = self.slowest
        return {
            "links": [link.as_dict() for link in self.links],
            "slowest": slowest.key if slowest else None,
            "accelerator_hours": self.accelerator_hours,
            "accelerators": self.accelerators,
            "size_source": self.size_source,
        }

    @property
    def size_phrase(self) -> str:
        """ "8 accelerators, declared" (or "reported by the job")."""
        source = "declared" if self.size_source == "declared" else "reported by the job"
        return f"{self.accelerators} accelerators, {source}"


def measure(
    rows: Sequence[Row],
    first_at: datetime,
    first_step: int | None,
    size: DeclaredSize | None = None,
) -> Durations:
    """Each link of the chain, from the timeline ``rows`` (in timeline order) and the
    incident's first anomalous point; accelerator-hours when the job's size is declared."""
    first = Row(FIRST_ANOMALOUS_POINT, first_at, first_step)
    alert_index = _find(rows, 0, (ALERT_RAISED,))
    alert = rows[alert_index] if alert_index is not None else None
    stop_index = _find(rows, alert_index + 1, STOP_KINDS) if alert_index is not None else None
    stop = rows[stop_index] if stop_index is not None else None
    starts = {
        "first": (first, 0),
        "alert": (alert, None if alert_index is None else alert_index + 1),
        "stop": (stop, None if stop_index is None else stop_index + 1),
    }
    measured = {spec.key: _measure_link(rows, spec, *starts[spec.start]) for spec in LINKS}
    brake = measured["brake"]
    escalate = next(spec for spec in LINKS if spec.key == "escalate")
    braking_alert = _row_at(rows, brake.start_at, brake.start_kind) if brake.measured else None
    measured["escalate"] = _link(escalate, alert if braking_alert else None, braking_alert)
    links = [measured[spec.key] for spec in LINKS]
    hours = None
    if size is not None and stop is not None:
        hours = size.accelerators * (stop.at - first_at).total_seconds() / 3600.0
    if size is None:
        return Durations(tuple(links), hours, None)
    return Durations(tuple(links), hours, size.accelerators, size.source)


def _measure_link(
    rows: Sequence[Row], spec: LinkSpec, start: Row | None, after: int | None
) -> Link:
    end_index = None
    if start is not None and after is not None and spec.ends:
        end_index = _first_index_of(rows, after, spec.ends)
    end = rows[end_index] if end_index is not None else None
    if spec.start == "alert" and end_index is not None:
        start = _causing_alert(rows, end_index) or start
    return _link(spec, start, end)


def _row_at(rows: Sequence[Row], at: datetime | None, kind: str | None) -> Row | None:
    return next((row for row in rows if row.at == at and row.kind == kind), None)


def _ends_a_link(row: Row, kinds: tuple[str, ...]) -> bool:
    # A page that failed reached nobody: it ends no link (it is still on the timeline).
    failed = row.kind == NOTIFICATION_SENT and row.data.get("status") == "failed"
    return row.kind in kinds and not failed


def _find(rows: Sequence[Row], start: int, kinds: Iterable[str]) -> int | None:
    kinds = tuple(kinds)
    return next((i for i in range(start, len(rows)) if _ends_a_link(rows[i], kinds)), None)


def _first_index_of(
    rows: Sequence[Row], start: int, groups: tuple[tuple[str, ...], ...]
) -> int | None:
    for kinds in groups:
        index = _find(rows, start, kinds)
        if index is not None:
            return index
    return None


def _causing_alert(rows: Sequence[Row], end_index: int) -> Row | None:
    """The latest raise or escalation, before the end row, of the alert the end row names."""
    alert_id = rows[end_index].alert_id
    if alert_id is None:
        return None
    for index in range(end_index - 1, -1, -1):
        row = rows[index]
        if row.alert_id == alert_id and row.kind in (ALERT_RAISED, SEVERITY_CHANGED):
            return row
    return None


def _link(spec: LinkSpec, start: Row | None, end: Row | None) -> Link:
    if start is None or end is None:
        return Link(
            spec.key,
            spec.label,
            None,
            None,
            start.at if start else None,
            None,
            None,
            start.kind if start else None,
        )
    steps = None
    if start.step is not None and end.step is not None:
        steps = end.step - start.step
    seconds = (end.at - start.at).total_seconds()
    return Link(spec.key, spec.label, seconds, steps, start.at, end.at, end.kind, start.kind)


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


# --- Statistics over many incidents (the team report) ----------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (the
    "inclusive" method, NumPy's default): None for no values, the value itself for one."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, not {q}")
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class LinkStats:
    measured: int  # incidents where the link was measured
    median: float | None
    p90: float | None

    def as_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "median": self.median, "p90": self.p90}


def link_stats(durations: Iterable[Durations]) -> dict[str, LinkStats]:
    """Median and p90 seconds of each link over the incidents where it was measured."""
    durations = list(durations)
    stats = {}
    for key in LINK_KEYS:
        values = [s for d in durations if (s := d.link(key).seconds) is not None]
        stats[key] = LinkStats(len(values), percentile(values, 50), percentile(values, 90))
    return stats


def format_seconds(seconds: float | None) -> str:
    """A duration as people read it: "850 ms", "42 s", "6 min 3 s", "2 h 30 min"."""
    if seconds is None:
        return "not measured"
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 1:
        return f"{sign}{seconds * 1000:.0f} ms"
    if seconds < 60:
        text = f"{seconds:.1f}".rstrip("0").rstrip(".")
        return f"{sign}{text} s"
    whole = round(seconds)
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{sign}{minutes} min" + (f" {rest} s" if rest else "")
    hours, rest = divmod(whole, 3600)
    minutes = rest // 60
    return f"{sign}{hours} h" + (f" {minutes} min" if minutes else "")
