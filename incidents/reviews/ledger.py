"""The goodput ledger — pure, no Django: where a job's accelerator-hours went.

For each job over a period: the wall time it ran, the accelerator-hours that is at its size
(``DeclaredSize``: declared, or reported by the job), the time each incident cost it and the
effective training time ratio (ETTR): productive time / wall time.

An incident's cost is split into five phases that follow each other and never overlap, so they
add up to the time from the restored checkpoint to training resumed:

* **lost progress** — restored checkpoint → first anomalous point: good training redone after a
  roll back (0 when training resumed without rolling back, or rolled back to a checkpoint
  written after the anomaly began);
* **detection** — first anomalous point → first alert (``durations``' detect link);
* **decision** — first alert → the alert or escalation whose command stopped training
  (the escalate link: a person deciding, or 0 for an automatic L3);
* **saving** — that alert → training stopped with its checkpoint (the brake link);
* **recovery** — stopped → resumed (the recover link); a job that stopped and never resumed
  keeps recovering until it ended, or until the period's end while it is still held.

Each link is measured once, in ``incidents.reviews.durations``; here they are only added.
An incident counts in the period (and the week) of its first anomalous point; its cost never
exceeds what the job ran in it (productive time is clipped at 0).

Per incident the story's two figures: "alarm after X" (first anomalous point → first alert)
and "brake after Y" (first anomalous point → training stopped), in seconds and steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from incidents.reviews.durations import Durations

PHASES: tuple[str, ...] = ("lost_progress", "detection", "decision", "saving", "recovery")
_LINK_OF_PHASE = {"detection": "detect", "decision": "escalate", "saving": "brake"}

__all__ = [
    "IncidentCost",
    "JobSpan",
    "Ledger",
    "PHASES",
    "incident_cost",
    "ledger",
    "week_starts",
]


@dataclass(frozen=True)
class JobSpan:
    """When a job ran: from its creation to its end (None: still running)."""

    job_id: int
    name: str
    start: datetime
    end: datetime | None
    accelerators: int | None = None  # None: no size declared or reported
    size_source: str | None = None


@dataclass(frozen=True)
class IncidentCost:
    incident_id: int
    job_id: int
    title: str
    level: str
    first_at: datetime
    phases: dict[str, float]  # seconds per phase of PHASES
    alarm_seconds: float | None
    alarm_steps: int | None
    brake_seconds: float | None
    brake_steps: int | None

    @property
    def lost_seconds(self) -> float:
        return sum(self.phases.values())


def _sum_steps(values: Iterable[int | None]) -> int | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def incident_cost(
    incident: tuple[int, int, str, str],
    durations: Durations,
    first_at: datetime,
    *,
    restored_at: datetime | None,
    held_until: datetime,
) -> IncidentCost:
    """The cost of one incident (id, job id, title, level) from its measured ``durations``.

    ``restored_at``: when the checkpoint training was rolled back to was written (None: no
    roll back); ``held_until``: the job's end, or the period's end while it still runs —
    where the recovery of a stop that was never resumed ends."""
    phases = {name: durations.link(link).seconds or 0.0 for name, link in _LINK_OF_PHASE.items()}
    recover, brake = durations.link("recover"), durations.link("brake")
    if recover.seconds is not None:
        phases["recovery"] = recover.seconds
    elif brake.end_at is not None:
        phases["recovery"] = max(0.0, (held_until - brake.end_at).total_seconds())
    else:
        phases["recovery"] = 0.0
    lost = (first_at - restored_at).total_seconds() if restored_at is not None else 0.0
    phases["lost_progress"] = max(0.0, lost)
    detect = durations.link("detect")
    chain = [durations.link(key) for key in ("detect", "escalate", "brake")]
    return IncidentCost(
        incident_id=incident[0],
        job_id=incident[1],
        title=incident[2],
        level=incident[3],
        first_at=first_at,
        phases={name: phases[name] for name in PHASES},
        alarm_seconds=detect.seconds,
        alarm_steps=detect.steps,
        brake_seconds=(brake.end_at - first_at).total_seconds() if brake.end_at else None,
        brake_steps=_sum_steps(link.steps for link in chain) if brake.end_at else None,
    )


def _overlap(job: JobSpan, since: datetime, until: datetime) -> float:
    end = min(job.end or until, until)
    return max(0.0, (end - max(job.start, since)).total_seconds())


def _hours(accelerators: int | None, seconds: float) -> float | None:
    return None if accelerators is None else accelerators * seconds / 3600.0


@dataclass(frozen=True)
class Line:
    """One job's (or a sum's) figures over a period."""

    wall_seconds: float
    lost: dict[str, float]
    accelerator_hours: float | None
    lost_accelerator_hours: float | None
    incidents: int

    @property
    def lost_seconds(self) -> float:
        return sum(self.lost.values())

    @property
    def productive_seconds(self) -> float:
        return max(0.0, self.wall_seconds - self.lost_seconds)

    @property
    def ettr(self) -> float | None:
        return self.productive_seconds / self.wall_seconds if self.wall_seconds > 0 else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "wall_seconds": self.wall_seconds,
            "productive_seconds": self.productive_seconds,
            "lost_seconds": self.lost_seconds,
            "lost": dict(self.lost),
            "ettr": self.ettr,
            "accelerator_hours": self.accelerator_hours,
            "lost_accelerator_hours": self.lost_accelerator_hours,
            "incidents": self.incidents,
        }


def _job_line(
    job: JobSpan, costs: Sequence[IncidentCost], since: datetime, until: datetime
) -> Line:
    wall = _overlap(job, since, until)
    mine = [c for c in costs if c.job_id == job.job_id and since <= c.first_at < until]
    lost = {name: sum(c.phases[name] for c in mine) for name in PHASES}
    total = sum(lost.values())
    if total > wall > 0:  # an incident never costs more than the job ran in the period
        lost = {name: seconds * wall / total for name, seconds in lost.items()}
    lost_total = min(total, wall)
    return Line(
        wall_seconds=wall,
        lost=lost,
        accelerator_hours=_hours(job.accelerators, wall),
        lost_accelerator_hours=_hours(job.accelerators, lost_total),
        incidents=len(mine),
    )


def _sum(lines: Sequence[Line]) -> Line:
    def known(values: list[float | None]) -> float | None:
        numbers = [v for v in values if v is not None]
        return sum(numbers) if numbers else None

    return Line(
        wall_seconds=sum(line.wall_seconds for line in lines),
        lost={name: sum(line.lost[name] for line in lines) for name in PHASES},
        accelerator_hours=known([line.accelerator_hours for line in lines]),
        lost_accelerator_hours=known([line.lost_accelerator_hours for line in lines]),
        incidents=sum(line.incidents for line in lines),
    )


def week_starts(since: datetime, until: datetime) -> list[datetime]:
    """The Mondays 00:00 (in ``since``'s zone) of the weeks [since, until) touches."""
    monday = (since - timedelta(days=since.weekday())).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    weeks = []
    while monday < until:
        weeks.append(monday)
        monday += timedelta(days=7)
    return weeks


@dataclass(frozen=True)
class Ledger:
    jobs: list[tuple[JobSpan, Line]]
    total: Line
    weeks: list[tuple[datetime, Line]]
    incidents: list[IncidentCost] = field(default_factory=list)


def ledger(
    jobs: Sequence[JobSpan], costs: Sequence[IncidentCost], since: datetime, until: datetime
) -> Ledger:
    """The ledger of ``jobs`` over [since, until), with a line per week (clipped to the period)."""
    lines = [(job, _job_line(job, costs, since, until)) for job in jobs]
    weeks = []
    for start in week_starts(since, until):
        low, high = max(start, since), min(start + timedelta(days=7), until)
        weeks.append((start, _sum([_job_line(job, costs, low, high) for job in jobs])))
    counted = [c for c in costs if since <= c.first_at < until]
    return Ledger(lines, _sum([line for _, line in lines]), weeks, counted)
