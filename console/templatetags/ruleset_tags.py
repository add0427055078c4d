"""The "not drilled since <change>" badge of a team's rule set, as inclusion tags: one line on
the job page and on the dashboard, whichever view renders them
(``breakers.detection.rulesets.drill_badge`` does the work)."""

from __future__ import annotations

from typing import Any

from django import template

from breakers.detection.rulesets import drill_badge
from incidents.models import Job, Team
from incidents.teams.access import visible_team_ids

register = template.Library()


@register.inclusion_tag("rules/drill_badge.html")
def job_drill_badge(job: Any) -> dict[str, Any]:
    """The badge of the job's team (``job``: the job page's serialised job or a Job)."""
    job_id = job["id"] if isinstance(job, dict) else job.pk
    team = Team.objects.get(jobs__pk=job_id)
    return {"badge": drill_badge(team), "show_team": False}


@register.inclusion_tag("rules/drill_badges.html", takes_context=True)
def teams_drill_badges(context: template.Context) -> dict[str, Any]:
    """The dashboard: a badge for each of the person's teams with jobs whose rules are not
    drilled (a drilled team shows nothing there)."""
    request = context.get("request")
    ids = visible_team_ids(request.user) if request is not None else []
    with_jobs = Job.objects.filter(team_id__in=ids).values_list("team_id", flat=True)
    badges = [drill_badge(t) for t in Team.objects.filter(pk__in=with_jobs).order_by("name")]
    return {"badges": [b for b in badges if not b.drilled]}
