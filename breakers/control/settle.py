"""Alerts of a job that ended (terminated, finished) settle: nothing is left to watch.

A heartbeat timeout, a communication failure, a straggler rank, a split command: each is about
processes that no longer exist once the job is final, and no heartbeat or point will ever come
to resolve it. Left firing, they would page and fill the dashboard for ever. Whatever way the
job ended (its acknowledgement, its last heartbeat, the executor, a retirement), the watchdog
resolves them — each with its timeline row saying why — and the incident settles with them.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from incidents.alerts.lifecycle import resolve_alert, settle_incident
from incidents.models import ACTIVE_ALERT_STATUSES, FINAL_JOB_STATUSES, Alert

BATCH = 200  # alerts per tick: the next tick takes the rest


def settle_final_jobs(now: datetime | None = None) -> int:
    """Resolve the active alerts of final jobs; how many were resolved."""
    now = now or timezone.now()
    firing = (
        Alert.objects.filter(status__in=ACTIVE_ALERT_STATUSES, job__status__in=FINAL_JOB_STATUSES)
        .order_by("pk")
        .values_list("pk", "job_id", "job__status")[:BATCH]
    )
    resolved = 0
    for alert_id, job_id, status in list(firing):
        with transaction.atomic():
            done = resolve_alert(
                alert_id,
                reason=f"the job is {status}: none of its processes is left to watch",
                now=now,
                data={"event": "job_ended"},
            )
            settle_incident(job_id, None, now=now)
        resolved += 1 if done else 0
    return resolved
