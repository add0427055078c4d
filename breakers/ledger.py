"""The goodput ledger of a team (or one of its jobs) over a period: what the service reads.

The arithmetic is ``incidents.reviews.ledger`` (pure); the durations of each incident are
``incidents.reviews.durations.measure``, the one home of every link. What is read here: the
team's jobs and when they ran (from creation to their last heartbeat or metric once final;
drill sandboxes are left out: a drill's faults are on purpose), their sizes, the incidents
whose first anomalous point falls in the period with their timelines, and — for a roll back —
when the checkpoint training went back to was written (the checkpoint catalogue).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from breakers.models import Checkpoint
from core.errors import InvalidInput, NotFound
from incidents.models import FINAL_JOB_STATUSES, Incident, Job, JobSize, TimelineKind
from incidents.reviews import ledger as core
from incidents.reviews.durations import Row, measure
from incidents.reviews.export import iso
from incidents.reviews.writeup import declared, timeline_rows
from incidents.teams.access import visible_team_ids
from incidents.teams.users import Visitor

MAX_JOBS = 5_000
MAX_INCIDENTS = 2_000
MAX_PERIOD_DAYS = 400


def _job_spans(team_id: int, job_id: int | None, since: datetime, until: datetime) -> list:
    jobs = Job.objects.filter(team_id=team_id, drill_sandbox=False, created_at__lt=until)
    if job_id is not None:
        jobs = jobs.filter(pk=job_id)
    rows = list(jobs.order_by("created_at", "pk")[: MAX_JOBS + 1])
    if len(rows) > MAX_JOBS:
        raise InvalidInput(f"More than {MAX_JOBS} jobs.", fields={"since": "a shorter period"})
    sizes = {s.job_id: declared(s) for s in JobSize.objects.filter(job__in=rows)}
    spans = []
    for job in rows:
        end = None
        if job.status in FINAL_JOB_STATUSES:
            seen = [t for t in (job.last_heartbeat_at, job.last_metric_at) if t is not None]
            end = max([job.created_at, *seen])
        if end is not None and end < since:
            continue
        size = sizes.get(job.pk)
        spans.append(
            core.JobSpan(
                job.pk,
                job.name,
                job.created_at,
                end,
                size.accelerators if size else None,
                size.source if size else None,
            )
        )
    return spans


def _restored_at(job_id: int, rows: list[Row]) -> datetime | None:
    """When the checkpoint of the incident's first roll back was written (None: none)."""
    resumed = next(
        (
            r
            for r in rows
            if r.kind == TimelineKind.RESUMED and r.data.get("event") == "rolled_back"
        ),
        None,
    )
    if resumed is None or not isinstance(resumed.data.get("step"), int):
        return None
    written = (
        Checkpoint.objects.filter(job_id=job_id, step=resumed.data["step"])
        .order_by("reported_at")
        .values_list("reported_at", flat=True)
        .first()
    )
    return written


def _costs(spans: list, since: datetime, until: datetime) -> list[core.IncidentCost]:
    by_id = {span.job_id: span for span in spans}
    incidents = list(
        Incident.objects.filter(
            job_id__in=by_id, first_time__gte=since, first_time__lt=until
        ).order_by("first_time", "pk")[: MAX_INCIDENTS + 1]
    )
    if len(incidents) > MAX_INCIDENTS:
        raise InvalidInput(
            f"More than {MAX_INCIDENTS} incidents.", fields={"since": "a shorter period"}
        )
    timelines = timeline_rows([i.pk for i in incidents])
    costs = []
    for incident in incidents:
        rows = [row for _, row in timelines[incident.pk]]
        span = by_id[incident.job_id]
        costs.append(
            core.incident_cost(
                (incident.pk, incident.job_id, incident.title, incident.level),
                measure(rows, incident.first_time, incident.first_step),
                incident.first_time,
                restored_at=_restored_at(incident.job_id, rows),
                held_until=min(span.end or until, until),
            )
        )
    return costs


def goodput_ledger(
    user: Visitor, team_id: int, since: datetime, until: datetime, job_id: int | None = None
) -> dict[str, Any]:
    """The team's ledger (or one job's) over [since, until); 404 outside the user's teams."""
    if team_id not in visible_team_ids(user):
        raise NotFound(f"There is no team {team_id}.")
    since, until = since.astimezone(UTC), until.astimezone(UTC)  # weeks begin Monday, UTC
    if since >= until:
        raise InvalidInput("Bad period.", fields={"since": "must be before until"})
    if until - since > timedelta(days=MAX_PERIOD_DAYS):
        raise InvalidInput(
            "Too long a period.", fields={"since": f"at most {MAX_PERIOD_DAYS} days before until"}
        )
    if job_id is not None and not Job.objects.filter(pk=job_id, team_id=team_id).exists():
        raise InvalidInput("No such job in this team.", fields={"job": "a job of this team"})
    spans = _job_spans(team_id, job_id, since, until)
    result = core.ledger(spans, _costs(spans, since, until), since, until)
    return ledger_document(team_id, job_id, since, until, result)


def ledger_document(
    team_id: int, job_id: int | None, since: datetime, until: datetime, result: core.Ledger
) -> dict[str, Any]:
    names = {span.job_id: span.name for span, _ in result.jobs}
    sizes = {span.job_id: span.accelerators for span, _ in result.jobs}
    return {
        "team": team_id,
        "job": job_id,
        "since": iso(since),
        "until": iso(until),
        "phases": list(core.PHASES),
        "total": result.total.as_dict(),
        "weeks": [{"week": iso(start), **line.as_dict()} for start, line in result.weeks],
        "jobs": [
            {
                "id": span.job_id,
                "name": span.name,
                "accelerators": span.accelerators,
                "size_source": span.size_source,
                "started_at": iso(span.start),
                "ended_at": iso(span.end),
                **line.as_dict(),
            }
            for span, line in result.jobs
        ],
        "incidents": [_incident_out(c, names, sizes) for c in result.incidents],
    }


def _incident_out(
    cost: core.IncidentCost, names: dict[int, str], sizes: dict[int, int | None]
) -> dict[str, Any]:
    accelerators = sizes.get(cost.job_id)
    return {
        "id": cost.incident_id,
        "job": names.get(cost.job_id),
        "job_id": cost.job_id,
        "title": cost.title,
        "level": cost.level,
        "first_at": iso(cost.first_at),
        "lost": dict(cost.phases),
        "lost_seconds": cost.lost_seconds,
        "lost_accelerator_hours": (
            None if accelerators is None else accelerators * cost.lost_seconds / 3600.0
        ),
        "alarm_after_seconds": cost.alarm_seconds,
        "alarm_after_steps": cost.alarm_steps,
        "brake_after_seconds": cost.brake_seconds,
        "brake_after_steps": cost.brake_steps,
    }
