"""The automatic first draft of a post-incident review, written from the timeline (pure).

The writer edits on top of it, so it states only what the record shows — what happened when,
who acted, which link was slowest — and leaves the root cause, a judgement, to a person.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from incidents.reviews.durations import (
    ACKNOWLEDGED,
    CHECKPOINT_SAVED,
    FIRST_ANOMALOUS_POINT,
    Durations,
    Row,
    format_seconds,
)

ACTOR_NAMES = {"system": "the system", "agent": "the training process"}


@dataclass(frozen=True)
class IncidentFacts:
    id: int
    title: str
    level: str
    job: str  # "team/job"
    first_at: datetime
    first_step: int | None


def clock(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def actor_name(row: Row) -> str:
    return row.actor or ACTOR_NAMES.get(row.actor_kind, row.actor_kind)


def draft(facts: IncidentFacts, rows: Sequence[Row], durations: Durations) -> dict[str, str]:
    """The five sections of the write-up (summary, impact, root cause, contributing factors,
    what went well) as text; the root cause is left for the writer."""
    return {
        "summary": _summary(facts, rows, durations),
        "impact": _impact(durations),
        "root_cause": "",
        "contributing_factors": _bullets(_contributing(rows, durations)),
        "what_went_well": _bullets(_went_well(rows, durations)),
    }


def chronology(facts: IncidentFacts, rows: Sequence[Row]) -> list[str]:
    """One line per timeline row: the time, the offset from the first anomalous point, what
    happened and who did it."""
    lines = []
    for row in rows:
        offset = format_seconds((row.at - facts.first_at).total_seconds())
        step = f" (step {row.step})" if row.step is not None else ""
        lines.append(f"{clock(row.at)} [+{offset}]{step} {row.message} — {actor_name(row)}")
    return lines


def _summary(facts: IncidentFacts, rows: Sequence[Row], durations: Durations) -> str:
    detect, escalate, brake, recover = (
        durations.link(key) for key in ("detect", "escalate", "brake", "recover")
    )
    where = f" at step {facts.first_step}" if facts.first_step is not None else ""
    sentences = [
        f"{facts.level} incident #{facts.id} on job {facts.job}: {facts.title}.",
        f"The first anomalous point was{where} ({clock(facts.first_at)}); the alert was raised "
        f"{format_seconds(detect.seconds)} later."
        if detect.measured
        else f"The first anomalous point was{where} ({clock(facts.first_at)}).",
    ]
    if brake.measured:
        how = "with a confirmed checkpoint" if brake.end_kind == CHECKPOINT_SAVED else "for good"
        which = "the alert"
        if escalate.seconds:
            # Said from which alert: the first one's time to the one that braked is its own link.
            which = (
                f"the alert that braked, raised {format_seconds(escalate.seconds)} after the first"
            )
        assert brake.end_at is not None
        stopped_at = format_seconds((brake.end_at - facts.first_at).total_seconds())
        sentences.append(
            f"Training was stopped {how} {format_seconds(brake.seconds)} after {which}"
            + (f", {brake.steps} steps later" if brake.steps else "")
            + f" ({stopped_at} after the first anomalous point)."
        )
    else:
        sentences.append("The timeline shows no confirmed stop of the training.")
    if recover.measured:
        sentences.append(f"It resumed {format_seconds(recover.seconds)} after the stop.")
    text = " ".join(sentences)
    text += "\n\nWhat happened when:\n" + _bullets(chronology(facts, rows))
    text += "\n\nWho acted: " + _who_acted(rows) + "."
    return text


def _who_acted(rows: Sequence[Row]) -> str:
    acts: dict[str, list[str]] = {}
    for row in rows:
        if row.kind == FIRST_ANOMALOUS_POINT:
            continue  # an observation, nobody's act
        kinds = acts.setdefault(actor_name(row), [])
        label = row.kind.replace("_", " ")
        if label not in kinds:
            kinds.append(label)
    return "; ".join(f"{who} ({', '.join(kinds)})" for who, kinds in acts.items()) or "nobody"


def _impact(durations: Durations) -> str:
    brake, recover = durations.link("brake"), durations.link("recover")
    parts = []
    if recover.measured:
        parts.append(f"Training stood still for {format_seconds(recover.seconds)}.")
    elif brake.measured:
        parts.append("Training was stopped and has not resumed on this timeline.")
    if durations.accelerator_hours is not None:
        parts.append(
            f"Between the first anomalous point and the brake the job held "
            f"{durations.accelerators} accelerators: {durations.accelerator_hours:.2f} "
            f"accelerator-hours spent on a faulty run (its size {_size_source(durations)})."
        )
    elif brake.measured:
        parts.append(
            "The job's size is neither declared nor reported (it saw no accelerator), so "
            "accelerator-hours are not measured."
        )
    return " ".join(parts)


def _contributing(rows: Sequence[Row], durations: Durations) -> list[str]:
    lines = []
    slowest = durations.slowest
    if slowest is not None:
        lines.append(
            f"The slowest link was {slowest.label.lower()}: {format_seconds(slowest.seconds)}."
        )
    missing = [link.label.lower() for link in durations.links if not link.measured]
    if missing:
        lines.append("Not measured (no row on the timeline): " + ", ".join(missing) + ".")
    for row in rows:
        if row.kind == "command_acknowledged" and row.data.get("status") == "failed":
            lines.append(f"A command failed: {row.message}.")
        elif row.data.get("executor"):
            lines.append(f"The job did not answer in time: {row.message}")
        elif row.kind == "severity_changed":
            lines.append(f"{row.message}.")
    return lines


def _went_well(rows: Sequence[Row], durations: Durations) -> list[str]:
    lines = []
    alert_at = durations.link("brake").start_at
    for row in rows:
        if row.kind == "command_issued" and row.actor_kind == "system" and alert_at:
            after = format_seconds((row.at - alert_at).total_seconds())
            lines.append(
                f"The system issued {row.data.get('kind', 'a command')} on its own, {after} "
                "after the alert, without waiting for anyone."
            )
        elif row.kind == CHECKPOINT_SAVED:
            lines.append(f"{row.message}.")
        elif row.kind == "resources_released":
            lines.append("The accelerators were released while the job was paused.")
        elif row.kind == ACKNOWLEDGED:
            lines.append(f"{actor_name(row)} acknowledged the alert.")
    return lines


def _bullets(lines: Sequence[str]) -> str:
    return "\n".join(f"- {line}" for line in lines)


def _size_source(durations: Durations) -> str:
    return "declared" if durations.size_source == "declared" else "as the job reported it"
