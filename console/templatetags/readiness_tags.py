"""The sandbox readiness panel (job page) and summary (dashboard), as inclusion tags.

Tags rather than view context so the job page and the dashboard gain them with one line of
template each, whichever view renders them (``breakers.snapshots.queries`` does the work)."""

from __future__ import annotations

from typing import Any

from django import template

from breakers.snapshots import queries
from breakers.snapshots.resume import RESUME_RULE_KEY
from incidents.models import ACTIVE_ALERT_STATUSES, Alert

register = template.Library()


@register.inclusion_tag("snapshots/readiness_panel.html")
def job_readiness(job: Any) -> dict[str, Any]:
    job_id = job["id"] if isinstance(job, dict) else job.pk
    resume_alert = (
        Alert.objects.filter(
            job_id=job_id, rule_key=RESUME_RULE_KEY, status__in=ACTIVE_ALERT_STATUSES
        )
        .order_by("-raised_at")
        .first()
    )
    return {
        "job_id": job_id,
        "readiness": queries.job_readiness(job_id).as_dict(),
        "snapshot_count": len(queries.job_snapshots(job_id, limit=1000)),
        "resume_alert": resume_alert,
        "replicas": queries.job_replicas(job_id),
    }


@register.inclusion_tag("snapshots/readiness_summary.html")
def jobs_readiness(rows: list[dict[str, Any]]) -> dict[str, Any]:
    jobs = [row["job"] for row in rows]
    grades = queries.readiness_of_jobs([job["id"] for job in jobs])
    entries = [{"job": job, "readiness": grades[job["id"]].as_dict()} for job in jobs]
    graded = [entry for entry in entries if entry["readiness"]["grade"] != "unknown"]
    return {"entries": graded, "without_snapshot": len(entries) - len(graded)}
