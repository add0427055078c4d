"""A team's incident report: its incidents over a period, with the median and p90 of each link
of the chain by level, so the team sees whether its alarm-to-brake chain is getting shorter.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from core.errors import InvalidInput, NotFound
from incidents.models import Incident, JobSize, Severity, Team
from incidents.reviews.durations import Durations, link_stats, measure
from incidents.reviews.export import iso
from incidents.reviews.writeup import declared, timeline_rows
from incidents.teams.access import visible_team_ids
from incidents.teams.users import Visitor

# A period's incidents are measured in one pass; a bound keeps one request from reading a
# whole database (ask for a shorter period).
MAX_INCIDENTS = 2_000


def team_incident_report(user: Visitor, team_id: int, since: datetime, until: datetime) -> dict:
    """Incidents of the team opened in [since, until), measured; 404 outside the user's teams."""
    if team_id not in visible_team_ids(user):
        raise NotFound(f"There is no team {team_id}.")
    _check_storable(since, "since")
    _check_storable(until, "until")
    if since >= until:
        raise InvalidInput("Bad period.", fields={"since": "must be before until"})
    team = Team.objects.get(pk=team_id)
    incidents = _incidents(team_id, since, until)
    rows = timeline_rows([i.pk for i in incidents])
    sizes = {s.job_id: s for s in JobSize.objects.filter(job_id__in={i.job_id for i in incidents})}
    measured = [
        (
            incident,
            measure(
                [row for _, row in rows[incident.pk]],
                incident.first_time,
                incident.first_step,
                declared(sizes.get(incident.job_id)),
            ),
        )
        for incident in incidents
    ]
    levels = [level for level in Severity.values if any(i.level == level for i in incidents)]
    groups = [(level, [d for i, d in measured if i.level == level]) for level in levels]
    return {
        "team": {"id": team.pk, "name": team.name},
        "since": iso(since),
        "until": iso(until),
        "incidents": [_incident_line(incident, durations) for incident, durations in measured],
        "levels": [_level_line(level, group) for level, group in groups]
        + [_level_line("all", [d for _, d in measured])],
        "drill_incidents": Incident.objects.filter(
            job__team_id=team_id, opened_at__gte=since, opened_at__lt=until, job__drill_sandbox=True
        ).count(),
    }


def _check_storable(moment: datetime, name: str) -> None:
    """A moment a database can compare with: in UTC within the years 1 … 9999 (the embedded
    SQLite mode converts it to UTC text; 9999-12-31T23:00-05:00 overflows there)."""
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(f"Bad {name}.", fields={name: "out of range once in UTC"}) from None


def _incidents(team_id: int, since: datetime, until: datetime) -> list[Incident]:
    # A fire drill's incident is a rehearsal with a fault injected on purpose: it is scored on
    # the drill's own page and would only blur the team's real chain here.
    incidents = list(
        Incident.objects.filter(job__team_id=team_id, opened_at__gte=since, opened_at__lt=until)
        .exclude(job__drill_sandbox=True)
        .select_related("job")
        .order_by("opened_at", "id")[: MAX_INCIDENTS + 1]
    )
    if len(incidents) > MAX_INCIDENTS:
        raise InvalidInput(
            f"More than {MAX_INCIDENTS} incidents in this period.",
            fields={"since": "choose a shorter period"},
        )
    return incidents


def _incident_line(incident: Incident, durations: Durations) -> dict[str, Any]:
    slowest = durations.slowest
    return {
        "id": incident.pk,
        "title": incident.title,
        "level": incident.level,
        "status": incident.status,
        "job": incident.job.name,
        "opened_at": iso(incident.opened_at),
        "links": {
            link.key: {"seconds": link.seconds, "steps": link.steps} for link in durations.links
        },
        "slowest": slowest.key if slowest else None,
        "accelerator_hours": durations.accelerator_hours,
    }


def _level_line(level: str, group: list[Durations]) -> dict[str, Any]:
    hours = [d.accelerator_hours for d in group if d.accelerator_hours is not None]
    return {
        "level": level,
        "incidents": len(group),
        "links": {key: stats.as_dict() for key, stats in link_stats(group).items()},
        "accelerator_hours": sum(hours) if hours else None,
    }
