"""A job of a thousand ranks as the console would hold it after a while of training: one
``JobRank`` row per rank (the columns ``incidents.heartbeats.record_heartbeat`` writes, written in
one bulk insert), the loss of every rank stored through the ingest service
(``breakers.agent.store.store_points``, one batch per rank, as each rank's SDK sends it),
a few silent ranks (past their deadline), a few stragglers (flagged by the pace check) and
the heartbeat watchdog's alert with its incident. Used by bench/ranks_console.py and the
browser test of the job page at a thousand ranks."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

WORLD = 1000
SILENT = (12, 713, 800, 801, 802, 900, 999)
STRAGGLERS = (77, 640)
HOSTS_PER_NODE = 8


@dataclass(frozen=True)
class Seeded:
    job_id: int
    alert_id: int | None
    incident_id: int | None


def loss(step: int, rank: int) -> float:
    """A falling loss, each rank a little apart (the band of all ranks a band), a straggler
    no different in value."""
    return 3.0 / (1.0 + step / 50.0) + (rank % 17) * 0.015 + ((step + rank) % 5) * 0.004


def silent_of(world: int) -> tuple[int, ...]:
    """The silent ranks of a job of ``world`` ranks: SILENT's, else its last rank."""
    return tuple(r for r in SILENT if r < world) or (world - 1,)


def _ranks(job_id: int, world: int, steps: int, now: datetime) -> list:
    from incidents.models import AgentStatus, JobRank

    rows = []
    for rank in range(world):
        silent = rank in silent_of(world)
        at = now - timedelta(seconds=90 if silent else 2)
        step_time = 0.5 if rank in STRAGGLERS else 0.31 + (rank % 13) * 0.001
        rows.append(
            JobRank(
                job_id=job_id,
                rank=rank,
                pid=20_000 + rank,
                hostname=f"gpu-{rank // HOSTS_PER_NODE:03d}",
                step=steps - (40 if silent else 1 if rank in STRAGGLERS else 0),
                step_time_seconds=step_time,
                compute_seconds=step_time * 0.8,
                last_heartbeat_at=at,
                # The silent a minute past theirs; the others' minutes away, however long a
                # loaded machine takes to open the page.
                heartbeat_deadline=at + timedelta(seconds=30 if silent else 600),
                status=AgentStatus.RUNNING,
                sync_step=None,
            )
        )
    return rows


def _store_loss(job_id: int, world: int, steps: int, now: datetime) -> None:
    from breakers.agent.protocol import PointIn
    from breakers.agent.store import store_points

    # Each rank logs a step a microsecond after the one before it: the last to log a step is
    # never rank 0.
    start = now - timedelta(seconds=steps * 0.31)
    for rank in range(world):
        last = steps - 40 if rank in silent_of(world) else steps
        points = [
            PointIn(
                "loss",
                s,
                loss(s, rank),
                start + timedelta(seconds=s * 0.31, microseconds=rank),
                None,
                rank,
            )
            for s in range(last)
        ]
        store_points(job_id, points, job_is_pending=False)


def seed_thousand(team: str, name: str, *, world: int = WORLD, steps: int = 200) -> Seeded:
    """The job, its ranks and their loss; the watchdog raises its heartbeat alert for real."""
    from django.utils import timezone

    from breakers.control.heartbeats import check_heartbeats
    from breakers.models import RankPaceHistory
    from incidents.jobs import create_job
    from incidents.models import Alert, Job, JobRank, JobStatus

    job = create_job(team, name).job
    _store_loss(job.pk, world, steps, timezone.now())
    now = timezone.now()
    JobRank.objects.bulk_create(_ranks(job.pk, world, steps, now), batch_size=500)
    RankPaceHistory.objects.bulk_create(
        RankPaceHistory(job_id=job.pk, rank=r, usual_step_time=0.31, samples=20, flagged=True)
        for r in STRAGGLERS
        if r < world
    )
    earliest = now - timedelta(seconds=60)  # the silent ranks' deadline
    Job.objects.filter(pk=job.pk).update(
        world_size=world,
        status=JobStatus.RUNNING,
        current_step=steps,
        last_heartbeat_at=now,
        last_heartbeat_step=steps,
        heartbeat_deadline=earliest,
        step_time_seconds=0.31,
    )
    check_heartbeats(now)
    alert = Alert.objects.filter(job_id=job.pk).order_by("-pk").first()
    return Seeded(job.pk, alert and alert.pk, alert and alert.incident_id)
