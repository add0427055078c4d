"""The ranks table of the job page, as an inclusion tag: one line in templates/job.html,
whichever view renders it (``console.ranks_table`` does the work, a page at a time)."""

from __future__ import annotations

from typing import Any

from django import template

from console.ranks_table import RanksQuery, ranks_page

register = template.Library()


@register.inclusion_tag("partials/job_ranks.html", takes_context=True)
def job_ranks(context: template.Context, job: Any) -> dict[str, Any]:
    job_id = job["id"] if isinstance(job, dict) else job.pk
    request = context.get("request")
    params = request.GET if request is not None else {}
    return {"table": ranks_page(job_id, RanksQuery.parse(params))}


@register.filter
def thousands(value: int) -> str:
    """1000 → "1,000" (the console's one locale)."""
    return f"{value:,}"


@register.filter
def subtract(value: int, named: list) -> int:
    """How many are left once ``named`` are named."""
    return value - len(named)
