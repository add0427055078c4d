"""The goodput ledger as CSV — pure, no Django: one table, a row per scope.

``scope`` says what a row is: ``total`` (the team or job over the period), ``week`` (the
weekly trend), ``job`` or ``incident``. Columns that do not apply to a scope are empty.
Text a spreadsheet would run as a formula (a job named ``=HYPERLINK(…)``) is quoted with a
leading apostrophe.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from typing import Any

from incidents.reviews.ledger import PHASES

LINE_COLUMNS = (
    "wall_seconds",
    "productive_seconds",
    "ettr",
    "accelerator_hours",
    "lost_accelerator_hours",
    "lost_seconds",
    "incidents",
)
INCIDENT_COLUMNS = (
    "alarm_after_seconds",
    "alarm_after_steps",
    "brake_after_seconds",
    "brake_after_steps",
)
COLUMNS = (
    "scope",
    "id",
    "name",
    "at",
    "accelerators",
    *LINE_COLUMNS,
    *(f"lost_{phase}_seconds" for phase in PHASES),
    *INCIDENT_COLUMNS,
)


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def _line(scope: str, line: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    row = {"scope": scope, **{name: line.get(name) for name in LINE_COLUMNS}, **extra}
    row.update({f"lost_{phase}_seconds": line["lost"][phase] for phase in PHASES})
    return row


def ledger_csv(document: Mapping[str, Any]) -> str:
    """``breakers.ledger.goodput_ledger``'s document as CSV text."""
    rows = [_line("total", document["total"], at=document["since"])]
    rows += [_line("week", week, at=week["week"]) for week in document["weeks"]]
    rows += [
        _line("job", job, id=job["id"], name=job["name"], accelerators=job["accelerators"])
        for job in document["jobs"]
    ]
    for incident in document["incidents"]:
        row = {
            "scope": "incident",
            "id": incident["id"],
            "name": incident["job"],
            "at": incident["first_at"],
            "lost_seconds": incident["lost_seconds"],
            "lost_accelerator_hours": incident["lost_accelerator_hours"],
            **{f"lost_{phase}_seconds": incident["lost"][phase] for phase in PHASES},
            **{name: incident[name] for name in INCIDENT_COLUMNS},
        }
        rows.append(row)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({name: _cell(row.get(name)) for name in COLUMNS})
    return out.getvalue()
