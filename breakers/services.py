"""Breaker services: one function per verb, called by every entry point."""

from __future__ import annotations

from django.conf import settings

from breakers.agent_input import parse_heartbeat, parse_metrics
from breakers.ingest import store_points
from incidents.models import Job, JobStatus
from incidents.services import record_heartbeat


def ingest_metrics(job: Job, raw_body: bytes) -> int:
    """Validate and store one metrics batch of ``job``: all of it or nothing."""
    points = parse_metrics(raw_body, max_points=settings.AGENT_MAX_BATCH_POINTS)
    return store_points(job.pk, points, job_is_pending=job.status == JobStatus.PENDING)


def receive_heartbeat(job_id: int, raw_body: bytes) -> Job:
    heartbeat = parse_heartbeat(raw_body)
    return record_heartbeat(
        job_id,
        step=heartbeat.step,
        status=heartbeat.status,
        pid=heartbeat.pid,
        hostname=heartbeat.hostname,
    )


def pending_commands(job_id: int) -> list[dict]:
    """Commands waiting for the job's acknowledgement (the control plane fills this)."""
    return []
