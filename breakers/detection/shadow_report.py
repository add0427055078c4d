"""What each shadow rule of a team would have done over a period, against the real incidents
(the rules page and ``GET /api/v1/teams/<id>/rules/shadow``; the figures are
``shadow_core.compare``'s)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from breakers.detection import shadow_core
from breakers.detection.rulesets import current_version
from breakers.models import RuleSetVersion, ShadowFiring
from core.errors import InvalidInput, NotFound
from incidents.models import Incident, Team, TimelineEntry, TimelineKind
from incidents.reviews.export import iso
from incidents.teams.access import visible_team_ids
from incidents.teams.users import Visitor

# One request reads at most this many events and incidents; beyond, ask for a shorter period.
MAX_FIRINGS = 20_000
MAX_INCIDENTS = 2_000
MAX_JOBS_LISTED = 20


def _firings(team_id: int, since: datetime, until: datetime) -> list[tuple]:
    rows = list(
        ShadowFiring.objects.filter(job__team_id=team_id, fired_at__gte=since, fired_at__lt=until)
        .order_by("fired_at", "pk")
        .values_list(
            "rule_key", "job_id", "job__name", "fired_at", "fired_step", "severity", "action"
        )[: MAX_FIRINGS + 1]
    )
    if len(rows) > MAX_FIRINGS:
        raise InvalidInput(
            f"More than {MAX_FIRINGS} would-have-fired events in this period.",
            fields={"since": "choose a shorter period"},
        )
    return rows


def _incidents(team_id: int, since: datetime, until: datetime) -> list[shadow_core.RealIncident]:
    rows = list(
        Incident.objects.filter(job__team_id=team_id, opened_at__gte=since, opened_at__lt=until)
        .order_by("opened_at", "pk")
        .values_list("pk", "job_id", "first_time", "opened_at", "first_step", "resolved_at")[
            : MAX_INCIDENTS + 1
        ]
    )
    if len(rows) > MAX_INCIDENTS:
        raise InvalidInput(
            f"More than {MAX_INCIDENTS} incidents in this period.",
            fields={"since": "choose a shorter period"},
        )
    alarm_steps: dict[int, int | None] = {}
    raised = TimelineEntry.objects.filter(
        incident_id__in=[row[0] for row in rows], kind=TimelineKind.ALERT_RAISED
    ).order_by("incident_id", "at", "pk")
    for incident_id, step in raised.values_list("incident_id", "step"):
        alarm_steps.setdefault(incident_id, step)
    return [
        shadow_core.RealIncident(
            id=pk,
            job_id=job_id,
            first_at=first.timestamp(),
            alarm_at=opened.timestamp(),
            alarm_step=alarm_steps.get(pk, first_step),
            end_at=resolved.timestamp() if resolved else None,
        )
        for pk, job_id, first, opened, first_step, resolved in rows
    ]


def _intervals(team: Team) -> dict[str, list[shadow_core.Interval]]:
    """Per rule key, when it was in shadow mode (from the team's rule set versions)."""
    current_version(team)  # a change made outside the console is recorded first
    versions = RuleSetVersion.objects.filter(team=team).order_by("number")
    history = [(v.created_at.timestamp(), v.snapshot["rules"]) for v in versions]
    keys = {key for _, rules in history for key, rule in rules.items() if rule.get("shadow")}
    return {
        key: shadow_core.shadow_intervals(
            (at, bool(rules.get(key, {}).get("shadow"))) for at, rules in history
        )
        for key in keys
    }


def shadow_report(user: Visitor, team_id: int, since: datetime, until: datetime) -> dict:
    """Per rule in shadow mode (now, or with events in the period): how often it would have
    fired, on which jobs, and how that compares with the team's real incidents."""
    if team_id not in visible_team_ids(user):
        raise NotFound(f"There is no team {team_id}.")
    if since >= until:
        raise InvalidInput("Bad period.", fields={"since": "must be before until"})
    team = Team.objects.get(pk=team_id)
    intervals = _intervals(team)
    snapshot = current_version(team).snapshot["rules"]
    by_rule: dict[str, list[tuple]] = defaultdict(list)
    for row in _firings(team_id, since, until):
        by_rule[row[0]].append(row)
    keys = sorted({k for k, rule in snapshot.items() if rule.get("shadow")} | set(by_rule))
    incidents = _incidents(team_id, since, until) if keys else []
    return {
        "team": {"id": team.pk, "name": team.name},
        "since": iso(since),
        "until": iso(until),
        "lead_seconds": shadow_core.LEAD_SECONDS,
        "rules": [
            _rule_line(key, snapshot.get(key), by_rule[key], incidents, intervals.get(key, []))
            for key in keys
        ],
    }


def _rule_line(
    key: str,
    rule: dict[str, Any] | None,
    rows: list[tuple],
    incidents: list[shadow_core.RealIncident],
    intervals: list[shadow_core.Interval],
) -> dict[str, Any]:
    firings = [
        shadow_core.Firing(job_id, at.timestamp(), step) for _, job_id, _, at, step, *_ in rows
    ]
    eligible = [i for i in incidents if shadow_core.in_intervals(i.alarm_at, intervals)]
    result = shadow_core.compare(firings, eligible)
    jobs: dict[int, dict[str, Any]] = {}
    for _, job_id, name, *_ in rows:
        jobs.setdefault(job_id, {"id": job_id, "name": name, "fired": 0})["fired"] += 1
    return {
        "key": key,
        "shadow": bool(rule and rule.get("shadow")),
        "severity": rule["severity"] if rule else (rows[-1][5] if rows else None),
        "action": rule["action"] if rule else (rows[-1][6] if rows else None),
        "fired": result.fired,
        "jobs": result.jobs,
        "inside_incidents": result.inside,
        "outside_incidents": result.outside,
        "incidents": result.incidents,
        "caught": result.caught,
        "caught_incidents": list(result.caught_ids),
        "median_lead_seconds": result.median_lead_seconds,
        "median_lead_steps": result.median_lead_steps,
        "last_fired_at": iso(rows[-1][3]) if rows else None,
        "per_job": sorted(jobs.values(), key=lambda j: -j["fired"])[:MAX_JOBS_LISTED],
    }
