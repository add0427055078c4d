"""The ranks table of the job page, as an inclusion tag: one line in templates/job.html,
whichever view renders it (``incidents.jobs.job_ranks`` does the work)."""

from __future__ import annotations

from typing import Any

from django import template

from incidents.jobs import job_ranks as ranks_of

register = template.Library()


@register.inclusion_tag("partials/job_ranks.html")
def job_ranks(job: Any) -> dict[str, Any]:
    job_id = job["id"] if isinstance(job, dict) else job.pk
    view = ranks_of(job_id)
    return {"ranks": view.ranks, "world_size": view.world_size, "missing": view.missing}
