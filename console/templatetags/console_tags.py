"""Template helpers of the console pages."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django import template

from breakers.checkpoints import catalogue

register = template.Library()


@register.filter
def tojson(value: Any) -> str:
    """JSON for a data-* attribute (autoescaping makes it attribute-safe)."""
    return json.dumps(value, default=str, separators=(",", ":"))


@register.filter
def number(value: Any) -> str:
    """A metric value as people read it: 5 significant digits, or NaN/Infinity as sent."""
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    return f"{value:.5g}"


@register.filter
def seconds(value: Any) -> str:
    """A duration: "42 s", "3 min 5 s", "2 h 10 min"."""
    if value is None:
        return "–"
    total = int(round(float(value)))
    if total < 60:
        return f"{float(value):.3g} s" if total < 10 else f"{total} s"
    if total < 3600:
        return f"{total // 60} min {total % 60} s"
    return f"{total // 3600} h {total % 3600 // 60} min"


@register.filter
def utc(value: Any) -> str:
    """A moment as every server-rendered page shows it: UTC, labelled ("2026-11-29 12:00:05
    UTC"). Takes a datetime or an ISO 8601 string (the payloads carry those)."""
    if value in (None, ""):
        return "–"
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


@register.filter
def split(value: str) -> list[str]:
    return value.split()


@register.simple_tag
def checkpoint_catalogue(job_id: int) -> list[dict[str, Any]]:
    """The job's checkpoints, newest first, clean or after the anomaly (breakers.checkpoints)."""
    return catalogue(job_id)
