"""The review's export formats (pure, no Django): the JSON document's timeline rows, rebuilding
them from a document, and the Markdown rendering.

The JSON document (``incidents.reviews.writeup.review_document``) is the complete record: from it
alone, ``rows_from_document`` rebuilds the timeline and ``durations_from_document`` measures
it again, elsewhere, with the same answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, overload

from incidents.reviews.content import TEXT_FIELDS
from incidents.reviews.draft import actor_name, clock
from incidents.reviews.durations import (
    DeclaredSize,
    Durations,
    Row,
    format_seconds,
    measure,
    steps_phrase,
)

FORMAT = "brakeline.review/1"
SECTION_TITLES = {
    "summary": "Summary",
    "impact": "Impact",
    "root_cause": "Root cause",
    "contributing_factors": "Contributing factors",
    "what_went_well": "What went well",
}


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


@overload
def parse_iso(text: str) -> datetime: ...
@overload
def parse_iso(text: None) -> None: ...
def parse_iso(text: str | None) -> datetime | None:
    # fromisoformat reads "Z" from Python 3.11 on.
    return datetime.fromisoformat(text) if text is not None else None


def row_as_dict(row: Row, row_id: int | None = None) -> dict[str, Any]:
    return {
        "id": row_id,
        "kind": row.kind,
        "at": iso(row.at),
        "actor": {"kind": row.actor_kind, "username": row.actor},
        "step": row.step,
        "message": row.message,
        "data": dict(row.data),
        "alert_id": row.alert_id,
    }


def rows_from_document(document: Mapping[str, Any]) -> list[Row]:
    """The timeline rows, rebuilt from an exported document."""
    return [
        Row(
            kind=item["kind"],
            at=parse_iso(item["at"]),
            step=item["step"],
            actor_kind=item["actor"]["kind"],
            actor=item["actor"]["username"],
            message=item["message"],
            data=item["data"],
            alert_id=item["alert_id"],
        )
        for item in document["timeline"]
    ]


def durations_from_document(document: Mapping[str, Any]) -> Durations:
    """Measure the chain again from the document's own rows, first point and job size."""
    first = document["incident"]["first_anomalous_point"]
    size = document.get("job_size")
    declared = (
        DeclaredSize(size["nodes"], size["gpus_per_node"], size.get("source", "declared"))
        if size
        else None
    )
    return measure(rows_from_document(document), parse_iso(first["at"]), first["step"], declared)


# --- Markdown ---------------------------------------------------------------------------------


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return lines


def to_markdown(document: Mapping[str, Any]) -> str:
    """The review as a Markdown document: facts, durations, write-up, follow-ups, timeline."""
    incident, review = document["incident"], document["review"]
    lines = [f"# Incident #{incident['id']} review: {incident['title']}", ""]
    lines += _facts(document)
    lines += ["", "## Durations", ""]
    lines += _durations(document["durations"])
    lines += _recoveries(document.get("recoveries") or [])
    for name in TEXT_FIELDS:
        lines += ["", f"## {SECTION_TITLES[name]}", "", review[name] or "_Not written yet._"]
    lines += ["", "## Follow-ups", ""]
    follow_ups = review["follow_ups"]
    if follow_ups:
        lines += _table(
            ["done", "follow-up", "owner", "due"],
            [
                ["[x]" if f["done"] else "[ ]", f["text"], f["owner"] or "", f["due_date"] or ""]
                for f in follow_ups
            ],
        )
    else:
        lines.append("_None._")
    lines += ["", "## Timeline", ""]
    lines += _timeline(document)
    return "\n".join(lines) + "\n"


def _recoveries(recoveries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The automatic recovery verdicts, each with its reasons (none: no section)."""
    if not recoveries:
        return []
    rows = [
        [
            r["verdict"],
            r["status"],
            f"pause #{r['pause_command_id']}, {r['rule_key']}, "
            f"steps {r['window'][0]}–{r['window'][1]}",
            "; ".join(r["reasons"]),
        ]
        for r in recoveries
    ]
    return ["", "## Automatic recovery", "", *_table(["verdict", "status", "brake", "why"], rows)]


def _facts(document: Mapping[str, Any]) -> list[str]:
    incident, review = document["incident"], document["review"]
    first = incident["first_anomalous_point"]
    job = incident["job"]
    size = document.get("job_size")
    facts = [
        f"- Job: {job['team']}/{job['name']} (#{job['id']})",
        f"- Level: {incident['level']} · incident status: {incident['status']}",
        f"- First anomalous point: step {first['step']}, {_clock(first['at'])}",
        f"- Review: {review['status']}, revision {review['revision']}"
        + (f", last edited by {review['updated_by']}" if review.get("updated_by") else ""),
    ]
    if size:
        source = "Declared" if size.get("source", "declared") == "declared" else "Reported"
        what = f"{size['nodes']} nodes × {size['gpus_per_node']} accelerators"
        named = f" ({size['accelerator']})" if size.get("accelerator") else ""
        facts.append(f"- {source} size: {what}{named}")
    return facts


def _durations(durations: Mapping[str, Any]) -> list[str]:
    rows = []
    for link in durations["links"]:
        mark = " (slowest)" if link["key"] == durations["slowest"] else ""
        steps = link["steps"]
        steps = steps_phrase(steps) if steps is not None and steps < 0 else steps
        cell = "" if steps is None else steps
        rows.append([link["label"] + mark, format_seconds(link["seconds"]), cell])
    lines = _table(["link", "time", "steps"], rows)
    hours = durations["accelerator_hours"]
    lines += [
        "",
        "Accelerator-hours from the first anomalous point to the brake: "
        + (f"{hours:.2f} ({_size_phrase(durations)})" if hours is not None else NOT_MEASURED)
        + ".",
    ]
    return lines


def _timeline(document: Mapping[str, Any]) -> list[str]:
    rows = rows_from_document(document)
    return _table(
        ["time", "step", "actor", "event"],
        [
            [_clock(iso(r.at)), "" if r.step is None else r.step, actor_name(r), r.message]
            for r in rows
        ],
    )


def _clock(text: str | None) -> str:
    return clock(parse_iso(text)) if text else ""


NOT_MEASURED = "not measured (no size declared, and the job reported no accelerator)"


def _size_phrase(durations: Mapping[str, Any]) -> str:
    source = "declared" if durations.get("size_source") == "declared" else "reported by the job"
    return f"{durations['accelerators']} accelerators, {source}"
