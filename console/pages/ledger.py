"""The goodput ledger as the team report page shows it: durations people read, ratios as
percentages, the weekly trend as bars (``breakers.ledger`` computes, this only formats)."""

from __future__ import annotations

from typing import Any

from incidents.reviews.durations import format_seconds


def _percent(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio * 100:.1f} %"


def _steps(steps: int | None) -> str:
    return "" if steps is None else f" · {steps} steps"


def ledger_for_page(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with the texts the page prints added beside the numbers."""
    for line in [document["total"], *document["weeks"], *document["jobs"]]:
        line["ettr_text"] = _percent(line["ettr"])
        line["bar"] = 0 if line["ettr"] is None else round(line["ettr"] * 100)
        line["wall_text"] = format_seconds(line["wall_seconds"])
        line["lost_text"] = format_seconds(line["lost_seconds"])
        line["phase_texts"] = [format_seconds(line["lost"][p]) for p in document["phases"]]
    for incident in document["incidents"]:
        incident["phase_texts"] = [format_seconds(incident["lost"][p]) for p in document["phases"]]
        incident["alarm_text"] = format_seconds(incident["alarm_after_seconds"]) + _steps(
            incident["alarm_after_steps"]
        )
        incident["brake_text"] = format_seconds(incident["brake_after_seconds"]) + _steps(
            incident["brake_after_steps"]
        )
    return document
