"""Heartbeats: what a rank's beat records (its row, its step time, its own deadline) and what
the whole job's row learns from it, and which jobs are past a deadline (``past_deadline``).
The watchdog that acts on a silence is the control plane's (``breakers.control.heartbeats``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, Min, OuterRef, Q
from django.utils import timezone

from core.errors import Conflict
from core.processes import process_start_time, this_host
from incidents.alerts.lifecycle import active_alert, append_timeline, resolve_alert
from incidents.jobs import mark_job_running, move_job
from incidents.models import (
    ACTIVE_INCIDENT_STATUSES,
    FINAL_JOB_STATUSES,
    ActorKind,
    AgentStatus,
    Job,
    JobRank,
    TimelineKind,
    job_statuses_for,
)
from incidents.rank_rows import RANK_HEARTBEAT_FIELDS, job_and_seats, write_seats

# Heartbeat timeout: the job's own setting, else this many measured step times, never below
# the floor (settings.HEARTBEAT_TIMEOUT_FLOOR_SECONDS), and the default until a step time has
# been measured (settings.HEARTBEAT_TIMEOUT_DEFAULT_SECONDS).
HEARTBEAT_STEP_TIME_MULTIPLIER = 8.0


# The alert the heartbeat watchdog raises (breakers.control.heartbeats) and a heartbeat resolves.
HEARTBEAT_RULE_KEY = "heartbeat-timeout"


# Weight of the newest measurement in the step-time moving average.
STEP_TIME_SMOOTHING = 0.2


def heartbeat_timeout_seconds(job: Job, step_time: float | None = None) -> float:
    """The job's own timeout, else 8 step times (``step_time``: one rank's; by default the
    job's, rank 0's), never below the floor; the default until a step time is measured."""
    if job.heartbeat_timeout_seconds:
        return job.heartbeat_timeout_seconds
    step_time = job.step_time_seconds if step_time is None else step_time
    if step_time:
        return max(
            settings.HEARTBEAT_TIMEOUT_FLOOR_SECONDS, HEARTBEAT_STEP_TIME_MULTIPLIER * step_time
        )
    return settings.HEARTBEAT_TIMEOUT_DEFAULT_SECONDS


def _measured_step_time(seat: JobRank | None, step: int, now: datetime) -> float | None:
    """The rank's step time, measured between two heartbeats of that same rank (ranks
    interleave, so two heartbeats of different ranks measure nothing)."""
    if seat is None:
        return None
    if step <= seat.step:
        return seat.step_time_seconds
    sample = (now - seat.last_heartbeat_at).total_seconds() / (step - seat.step)
    if seat.step_time_seconds is None:
        return sample
    return (1 - STEP_TIME_SMOOTHING) * seat.step_time_seconds + STEP_TIME_SMOOTHING * sample


def record_heartbeat(
    job_id: int,
    *,
    step: int,
    status: str,
    pid: int | None = None,
    hostname: str = "",
    rank: int | None = None,
    world_size: int | None = None,
    finish_event: str = "finish",
    now: datetime | None = None,
    pace: RankPaceReport | None = None,
    known: Job | None = None,
) -> Job:
    """Store one rank's heartbeat (no rank: rank 0): its row, with its own deadline.

    A steady beat of a rank other than 0 writes its own row only, locked alone: a thousand
    ranks of one job never queue behind one row lock. The job's row is written, under its
    lock, by a beat that says something of the whole job (``_says_job_wide``): rank 0's (the
    job-level agent fields: pid, host, status, step time — until rank 0 speaks, the reporting
    rank's), a new rank or world size, a finish, a first or restarted process, a rank back
    from silence. The job finishes when every rank has — by ``finish_event``: "terminate"
    when the caller knows the processes were told to stop (their last beat may overtake the
    acknowledgement). ``known``: the job as read in the caller's transaction, with nothing
    written to its row since (a node's other beats, ``record_node_heartbeats``)."""
    now = now or timezone.now()
    beat = RankBeat(rank or 0, step, status, pid, hostname, world_size, pace)
    job = known if known is not None else Job.objects.get(pk=job_id)
    if job.status in FINAL_JOB_STATUSES and status == AgentStatus.RUNNING:
        _refuse_a_new_run(job, beat.rank, pid)
    if _record_rank_alone(job, beat, now):
        return job
    return _record_job_heartbeat(job_id, beat, finish_event, now)


@dataclass(frozen=True, slots=True)
class RankBeat:
    """One rank's heartbeat, validated."""

    rank: int
    step: int
    status: str
    pid: int | None
    hostname: str
    world_size: int | None
    pace: RankPaceReport | None


def _says_job_wide(job: Job, beat: RankBeat) -> bool:
    """What the beat says of the whole job, before its rank's row is read."""
    resized = beat.world_size is not None and beat.world_size != job.world_size
    return (
        beat.rank == 0
        or resized
        or beat.status == AgentStatus.FINISHED
        or job.status in job_statuses_for("start")
    )


def _record_rank_alone(job: Job, beat: RankBeat, now: datetime) -> bool:
    """The steady beat: the rank's own row only (``job`` read without a lock), written as a
    compare-and-swap on the rank's last heartbeat, so no lock is held before the one UPDATE
    and a beat that turns out to say more can still lock the job's row first, as every other
    writer of both does. False, with nothing written, when the beat must also write the job's
    row (or another beat of the same rank wrote in between)."""
    if _says_job_wide(job, beat):
        return False
    rank_0 = JobRank.objects.filter(job_id=job.pk, rank=0)
    seat = (
        JobRank.objects.filter(job_id=job.pk, rank=beat.rank)
        .annotate(rank_0_spoke=Exists(rank_0))
        .first()
    )
    if seat is None or not seat.rank_0_spoke or _rank_back_or_new(seat, beat, now):
        return False
    previous = seat.last_heartbeat_at
    _update_rank(job, seat, beat, now)
    if seat.heartbeat_deadline is not None and (
        job.heartbeat_deadline is None or seat.heartbeat_deadline < job.heartbeat_deadline
    ):
        # Its deadline came nearer than the job's (a faster step: a shorter timeout): the
        # job's stays the earliest, so the watchdog's index on it still finds this rank.
        return False
    written = {name: getattr(seat, name) for name in RANK_HEARTBEAT_FIELDS}
    return JobRank.objects.filter(pk=seat.pk, last_heartbeat_at=previous).update(**written) == 1


def record_node_heartbeats(
    job_id: int, beats: Sequence[RankBeat], now: datetime
) -> tuple[Job, list[int]]:
    """Several ranks' beats (a node's, in one transaction): every steady one of a rank that
    beats once here written as ``_record_rank_alone`` writes it, all in one read of the job
    and its ranks' rows and one compare-and-swap UPDATE of those rows; the beats that must
    also write the job's row only for its deadline (a new rank, a rank back from silence, a
    deadline nearer than the job's) together under one lock of it (``_write_with_the_job``).
    Returns the job as read (or as written then), and the indexes of the beats left, in
    order, for ``record_heartbeat`` one at a time (``known``: the job returned): the job-wide
    ones, a final job's (they may be refused), a rank's second beat, a new process under a
    rank's number, and a beat whose row another beat wrote in between."""
    ranks = Counter(beat.rank for beat in beats)
    job, seats = job_and_seats(job_id, [0, *ranks])
    if job.status in FINAL_JOB_STATUSES or 0 not in seats:
        return job, list(range(len(beats)))
    written: list[tuple[JobRank, datetime]] = []
    with_job: list[tuple[JobRank, datetime]] = []
    new: list[JobRank] = []
    for beat in beats:
        seat = seats.get(beat.rank)
        if ranks[beat.rank] > 1 or _says_job_wide(job, beat) or _other_process(seat, beat):
            continue
        if seat is None:
            new.append(JobRank(job=job, rank=beat.rank))
            _update_rank(job, new[-1], beat, now)
            continue
        previous, overdue = seat.last_heartbeat_at, _overdue(seat, now)
        _update_rank(job, seat, beat, now)
        nearer = seat.heartbeat_deadline is not None and (
            job.heartbeat_deadline is None or seat.heartbeat_deadline < job.heartbeat_deadline
        )
        (with_job if overdue or nearer else written).append((seat, previous))
    done = write_seats(sorted(written, key=lambda each: each[0].pk))  # one lock order
    if new or with_job:
        job, more = _write_with_the_job(job, new, with_job, now)
        done |= more
    return job, [i for i, beat in enumerate(beats) if ranks[beat.rank] > 1 or beat.rank not in done]


def _write_with_the_job(
    read: Job, new: list[JobRank], known: list[tuple[JobRank, datetime]], now: datetime
) -> tuple[Job, set[int]]:
    """Ranks' beats that move the job's earliest deadline (each rank's row with the beat on
    it: ``new`` ranks, and ``known`` ones with their last heartbeat as read), under one lock
    of the job's row: the new ranks' rows in one INSERT, the others in one compare-and-swap
    UPDATE, the job's row written once, as ``_record_job_heartbeat`` writes it for each. A
    job of 10,000 ranks starts, or comes back from a console's stall, in 1,250 such
    transactions, not 10,000 queued on its row. Returns the job as written and the ranks
    written; a rank another transaction seated or wrote meanwhile (a retried bundle), or
    every beat if the job's status or size changed since ``read`` (what made these beats
    not job-wide), is left to the one-at-a-time path."""
    job = Job.objects.select_for_update().get(pk=read.pk)
    if (job.status, job.world_size) != (read.status, read.world_size):
        return job, set()
    taken = JobRank.objects.filter(job=job, rank__in=[seat.rank for seat in new])
    seated = set(taken.values_list("rank", flat=True)) if new else set()
    new = JobRank.objects.bulk_create([seat for seat in new if seat.rank not in seated])
    done = {seat.rank for seat in new} | write_seats(sorted(known, key=lambda each: each[0].pk))
    if not done:
        return job, done
    job.last_heartbeat_at = now
    job.heartbeat_deadline = _earliest_deadline(job)
    steps = [seat.step for seat in new] + [seat.step for seat, _ in known if seat.rank in done]
    newest = max(steps)
    job.current_step = max(newest, job.current_step if job.current_step is not None else newest)
    job.save(update_fields=["last_heartbeat_at", "heartbeat_deadline", "current_step"])
    # No beat here is a finished rank's or a new process's: what moves the job is only the
    # end of its silence.
    if _move_on_heartbeat(job, (new or [seat for seat, _ in known])[-1], False, "finish", now):
        job.refresh_from_db()
    return job, done


def _rank_back_or_new(seat: JobRank, beat: RankBeat, now: datetime) -> bool:
    """A rank that was past its deadline (its beat may end the job's silence), or finished,
    or another process under the rank's number (a restart)."""
    return _overdue(seat, now) or _other_process(seat, beat)


def _overdue(seat: JobRank, now: datetime) -> bool:
    return seat.heartbeat_deadline is None or seat.heartbeat_deadline < now


def _other_process(seat: JobRank | None, beat: RankBeat) -> bool:
    return (
        seat is not None and seat.pid is not None and beat.pid is not None and beat.pid != seat.pid
    )


def _record_job_heartbeat(job_id: int, beat: RankBeat, finish_event: str, now: datetime) -> Job:
    """A beat that writes the job's row too, under the job's row lock: the rank's row, the
    world size, the job-level agent fields, and the job's deadline — the earliest of its
    unfinished ranks' (what the watchdog's index finds it by)."""
    # No savepoint of its own: nothing here is refused, and a caller's transaction (a node's
    # bundle) rolls back whole on an error.
    with transaction.atomic(savepoint=False):
        job = Job.objects.select_for_update().get(pk=job_id)
        if beat.world_size is not None and beat.world_size != job.world_size:
            # A smaller restart leaves seats above its size: gone once, when the size changes
            # (not a DELETE with every heartbeat of a steady job).
            job.world_size = beat.world_size
            JobRank.objects.filter(job=job, rank__gte=beat.world_size).delete()
        seat = JobRank.objects.select_for_update().filter(job=job, rank=beat.rank).first()
        seat, new_process = _record_rank(job, seat, beat, now)
        job.last_heartbeat_at = now
        if seat.rank == 0 or not JobRank.objects.filter(job=job, rank=0).exists():
            # Rank 0's, or — until rank 0 speaks — the reporting rank's: a lone process that
            # inherited RANK=3 still gets its pid on the job for the executor.
            job.step_time_seconds, job.last_heartbeat_step = seat.step_time_seconds, beat.step
            job.agent_status, job.agent_pid = beat.status, seat.pid
            job.agent_hostname, job.agent_pid_start_time = seat.hostname, seat.pid_start_time
        job.heartbeat_deadline = _earliest_deadline(job)
        step = beat.step
        job.current_step = max(step, job.current_step if job.current_step is not None else step)
        job.save(update_fields=[*JOB_HEARTBEAT_FIELDS, "current_step"])
        moved = _move_on_heartbeat(job, seat, new_process, finish_event, now)
    if moved:  # another statement changed the row: read it back
        job.refresh_from_db()
    return job


def _move_on_heartbeat(
    job: Job, seat: JobRank, new_process: bool, finish_event: str, now: datetime
) -> bool:
    """The job's status as the beat moves it (read under the job's row lock), and the end of
    its silence; whether the row changed."""
    moved = False
    if seat.status == AgentStatus.FINISHED and _every_rank_finished(job):
        moved = move_job(job.pk, finish_event, heartbeat_deadline=None)
    elif job.status in job_statuses_for("start"):  # read under the lock: the first moves it
        moved = mark_job_running(job.pk)
    elif seat.status == AgentStatus.RUNNING and new_process:
        moved = _restarted_outside(job, seat, now)
    back = job.heartbeat_deadline is None or job.heartbeat_deadline >= now
    if job.heartbeat_overdue_since is not None and back:
        _end_heartbeat_silence(job, now)
        moved = True
    return moved


JOB_HEARTBEAT_FIELDS = (
    "world_size",
    "step_time_seconds",
    "last_heartbeat_at",
    "last_heartbeat_step",
    "agent_status",
    "agent_pid",
    "agent_hostname",
    "agent_pid_start_time",
    "heartbeat_deadline",
)


def past_deadline(now: datetime) -> Q:
    """Jobs with a rank past its own deadline at ``now`` (a job with no rank rows: past its
    own). The job's ``heartbeat_deadline`` is never later than its earliest rank's (every
    write of the job's row sets it to that, and a rank whose deadline comes nearer writes
    it), so its index narrows the search to a few jobs before their ranks are read."""
    ranks = JobRank.objects.filter(job=OuterRef("pk"))
    rank_silent = Exists(ranks.filter(heartbeat_deadline__lt=now))
    return Q(heartbeat_deadline__lt=now) & (Q(rank_silent) | ~Q(Exists(ranks)))


def _refuse_a_new_run(job: Job, rank: int, pid: int | None) -> None:
    """A process the finished (or terminated) job never had says it trains: a new run under an
    old token. Its breakers could never act (the job takes no more commands), so it is told,
    with 409, before anything is written; the job's own late heartbeats still count."""
    known = JobRank.objects.filter(job=job, rank=rank).values_list("pid", flat=True).first()
    if pid is not None and known is not None and pid != known:
        raise Conflict(
            f"Job '{job.name}' is {job.status}: a new run needs a job of its own "
            "(manage.py create_job) and its token; this one's breakers no longer act.",
            code="job_over",
        )


def _restarted_outside(job: Job, seat: JobRank, now: datetime) -> bool:
    """A process other than the one that paused says it trains: the job runs again (the
    "restart" event, from paused only), written on its open incident in the same transaction.
    Whether it moved."""
    if job.status not in job_statuses_for("restart") or not move_job(job.pk, "restart"):
        return False
    incident = job.incidents.filter(status__in=ACTIVE_INCIDENT_STATUSES).first()
    if incident is not None:
        append_timeline(
            incident.pk,
            TimelineKind.RESUMED,
            f"Training restarted outside the console: a new process (rank {seat.rank}, pid "
            f"{seat.pid}) reports it trains while the job was paused; its breakers act again.",
            at=now,
            step=seat.step,
            actor_kind=ActorKind.AGENT,
            data={"restart": True, "rank": seat.rank, "pid": seat.pid},
        )
    return True


@dataclass(frozen=True)
class RankPaceReport:
    """What a heartbeat says of the rank's place in its step (either may be absent: then the
    rank's last word stands)."""

    sync_step: int | None = None
    compute_seconds: float | None = None


def _record_rank(
    job: Job, seat: JobRank | None, beat: RankBeat, now: datetime
) -> tuple[JobRank, bool]:
    """The rank's row (``seat``: as read under its lock, None for a new rank), updated; and
    whether the heartbeat comes from another process than the rank's last one (a pid it did
    not have before: a restart)."""
    pid = beat.pid
    new_process = seat is not None and seat.pid is not None and pid is not None and pid != seat.pid
    if seat is None:
        seat = JobRank(job=job, rank=beat.rank)
    elif new_process:
        seat.sync_step = None  # another process: its old word is stale
    _update_rank(job, seat, beat, now)
    seat.save()
    return seat, new_process


def _update_rank(job: Job, seat: JobRank, beat: RankBeat, now: datetime) -> None:
    """The beat on the rank's row (not saved), its own deadline with it: now + the job's
    timeout for the rank's measured step time (none once the rank said it finished)."""
    known = seat.pk is not None
    step_time = _measured_step_time(seat, beat.step, now) if known else None
    if known and beat.step < seat.step:
        seat.sync_step = None  # a roll back: the old word is stale
    seat.step_time_seconds, seat.step, seat.status, seat.last_heartbeat_at = (
        step_time,
        beat.step,
        beat.status,
        now,
    )
    if beat.pid is not None:
        _register_process(seat, beat.pid, beat.hostname)
    if beat.hostname:
        seat.hostname = beat.hostname
    pace = beat.pace
    if pace is not None and pace.sync_step is not None:
        seat.sync_step = pace.sync_step
    if pace is not None and pace.compute_seconds is not None:
        seat.compute_seconds = pace.compute_seconds
    finished = beat.status == AgentStatus.FINISHED
    timeout = timedelta(seconds=heartbeat_timeout_seconds(job, step_time))
    seat.heartbeat_deadline = None if finished else now + timeout


def _earliest_deadline(job: Job) -> datetime | None:
    deadlines = JobRank.objects.filter(job=job, heartbeat_deadline__isnull=False)
    return deadlines.aggregate(earliest=Min("heartbeat_deadline"))["earliest"]


def _every_rank_finished(job: Job) -> bool:
    """Every rank said "finished": all of the world size when it is known, else all ranks
    that ever heartbeated (a job of one process finishes with its one heartbeat)."""
    ranks = JobRank.objects.filter(job=job)
    if ranks.exclude(status=AgentStatus.FINISHED).exists():
        return False
    return job.world_size is None or ranks.count() >= job.world_size


def _register_process(seat: JobRank, pid: int, hostname: str) -> None:
    """The reported pid, with its identity (start time) read here, server-side, only when the
    heartbeat says it comes from this very host: only then is /proc the process's own. A pid
    reported from elsewhere, or without a hostname, is kept with no identity, and the local
    executor never signals it (``breakers.executors.local``)."""
    same_process = (
        pid == seat.pid and seat.pid_start_time is not None and hostname in ("", seat.hostname)
    )
    if same_process:
        return  # registered already: its identity was read when it was first reported
    seat.pid = pid
    seat.pid_start_time = process_start_time(pid) if hostname == this_host() else None


def _end_heartbeat_silence(job: Job, now: datetime) -> None:
    """Heartbeats are back: clear the edge trigger and resolve the watchdog's alert."""
    Job.objects.filter(pk=job.pk).update(heartbeat_overdue_since=None)
    alert = active_alert(job.pk, HEARTBEAT_RULE_KEY, "")
    if alert is not None:
        assert job.heartbeat_overdue_since is not None  # what the caller checked
        silent = (now - job.heartbeat_overdue_since).total_seconds()
        resolve_alert(
            alert.pk,
            reason=f"heartbeats are back ({silent:.1f} s after the alert)",
            step=job.last_heartbeat_step,
            now=now,
        )
