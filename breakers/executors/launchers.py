"""Recording the launchers a job's ranks report (``JobLauncher``), with their identity proven.

A heartbeat's launcher fields are the agent's word. The console trusts a launcher enough to
signal it later only when, at registration, on the console's own host: the launcher's start
time read from /proc is the one reported, and the reporting rank's process (its pid) is the
launcher's child right now. Otherwise the row is kept with no ``start_time`` (another host: the
scheduler's executor stops that job) and the local executor never signals it.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from breakers.agent.protocol import HeartbeatIn
from breakers.models import JobLauncher
from core.processes import process_parent, process_start_time, this_host


def verified_start_time(heartbeat: HeartbeatIn) -> int | None:
    """The launcher's start time as this host's /proc says, when it proves to be the launcher
    of the reporting rank (see the module's docstring); else None."""
    launcher = heartbeat.launcher
    if launcher is None or heartbeat.hostname != this_host() or heartbeat.pid is None:
        return None
    started = process_start_time(launcher.pid)
    if started != launcher.start_time or process_parent(heartbeat.pid) != launcher.pid:
        return None
    return started


def record_launcher(job_id: int, heartbeat: HeartbeatIn) -> JobLauncher | None:
    """Store the reported launcher once (a write when it or the rank under it is new, not one
    per heartbeat)."""
    launcher = heartbeat.launcher
    if launcher is None:
        return None
    identity = {
        "job_id": job_id,
        "hostname": heartbeat.hostname,
        "pid": launcher.pid,
        "reported_start_time": launcher.start_time,
    }
    rank = heartbeat.rank or 0
    row = JobLauncher.objects.filter(**identity).first()
    now = timezone.now()
    if row is None:
        try:
            with transaction.atomic():
                return JobLauncher.objects.create(
                    **identity,
                    pgid=launcher.pgid,
                    start_time=verified_start_time(heartbeat),
                    ranks=[rank],
                    first_seen_at=now,
                    last_seen_at=now,
                )
        except IntegrityError:  # another rank of the same launcher registered it first
            row = JobLauncher.objects.get(**identity)
    if rank not in row.ranks:
        with transaction.atomic():
            row = JobLauncher.objects.select_for_update().get(pk=row.pk)
            row.ranks = sorted({*row.ranks, rank})
            row.last_seen_at = now
            if row.start_time is None:
                row.start_time = verified_start_time(heartbeat)
            row.save(update_fields=["ranks", "last_seen_at", "start_time"])
    return row
