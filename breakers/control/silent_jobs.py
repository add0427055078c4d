"""A multi-rank job whose every rank is silent, stuck in a collective: nobody is left to
acknowledge anything.

The heartbeat alert's brake (``checkpoint_and_pause``) waits for an acknowledgement before the
executor stops the job from outside (300 s by default), because a job that is merely slow
answers it. When every rank of a multi-rank job is silent and their last words show them in a
collective hang (some wait in a collective the others never entered, or all are inside one),
none can: a command is applied at a step boundary, and none reaches one. Waiting would keep
every accelerator of the job idle for the whole deadline. So the watchdog brings the command's
deadline to now, with a timeline row saying why (and naming the hung rank), and the same
tick's expiry hands the job to its executor — the one path every hung job takes. A single
process, or ranks that said nothing that places them in a collective, may be merely slow:
their pause is waited for, as before.

A paused job whose every rank fell silent holds nothing any more: its processes are gone (or
hung), a resume cannot reach them. Its heartbeat alert (already calling a person) says so, and
so does one timeline row.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from breakers.control.commands import STOP_ON_EXPIRY
from breakers.control.hearing import heard_until
from breakers.control.heartbeats import (
    Silence,
    every_rank_silent,
    heartbeat_signal,
    observed_only,
    silence_of,
)
from breakers.control.timeline import active_incident
from breakers.models import OPEN_COMMAND_STATUSES, Command, CommandAck
from incidents.alerts.lifecycle import active_alert, append_timeline, raise_or_update_alert
from incidents.heartbeats import HEARTBEAT_RULE_KEY
from incidents.models import Job, JobRank, JobStatus, TimelineEntry, TimelineKind

ALL_SILENT_EVENT = "all_ranks_silent"
WATCHED = (JobStatus.RUNNING, JobStatus.PAUSING, JobStatus.PAUSED)


def stop_silent_jobs(now: datetime | None = None) -> list[int]:
    """The watchdog's duty, after the heartbeat check: for each job with a heartbeat alert
    whose ranks are all silent now, bring its brake's deadline to now (running, pausing) or
    say it holds nothing (paused). Returns the ids of the commands made due. Judged up to the
    console's last beacon: ranks it could not hear are not silent (breakers.control.hearing)."""
    now = heard_until(now or timezone.now())
    due = []
    candidates = Job.objects.filter(heartbeat_overdue_since__isnull=False, status__in=WATCHED)
    for job_id in candidates.values_list("pk", flat=True):
        if JobRank.objects.filter(job_id=job_id, heartbeat_deadline__gte=now).exists():
            continue  # a rank still heartbeats (one probe of the rank-deadline index)
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.heartbeat_overdue_since is None or job.status not in WATCHED:
                continue  # a heartbeat came back meanwhile, or the job moved on
            if observed_only(job):
                continue  # the watchdog's rule is in shadow mode: its silence is only recorded
            silence = silence_of(job, now)
            if len(silence.ranks) < 2 or not every_rank_silent(job, silence):
                continue  # one process may be merely slow: its pause is waited for
            if job.status == JobStatus.PAUSED:
                _say_paused_job_holds_nothing(job, silence, now)
                continue
            command_id = _make_brake_due(job, silence, now)
            if command_id is not None:
                due.append(command_id)
    return due


def in_a_collective_hang(silence: Silence) -> bool:
    """The ranks' last words show them stuck in a collective: some wait in one the others
    never entered, or every one of them said it is inside the next step's sync. None of them
    reaches a step boundary, where a command is applied, so none can acknowledge. (Ranks all
    at one place with nothing said of a sync may be merely slow: their pause is waited for.)"""
    if silence.hang is not None:
        return True
    return all(r.sync_step is not None and r.sync_step > r.step for r in silence.ranks)


def _make_brake_due(job: Job, silence: Silence, now: datetime) -> int | None:
    if not in_a_collective_hang(silence):
        return None
    command = (
        Command.objects.filter(
            job_id=job.pk,
            kind__in=STOP_ON_EXPIRY,
            status__in=OPEN_COMMAND_STATUSES,
            deliver_by__gt=now,
        )
        .order_by("pk")
        .first()
    )
    if command is None or CommandAck.objects.filter(command_id=command.pk).exists():
        return None  # a rank that answered is at a boundary: the others may follow
    moved = Command.objects.filter(
        pk=command.pk, status__in=OPEN_COMMAND_STATUSES, deliver_by__gt=now
    ).update(deliver_by=now)
    if not moved:
        return None
    outcome = raise_or_update_alert(job.pk, heartbeat_signal(job, now), now=now)
    waited = (now - command.issued_at).total_seconds()
    left = (command.deliver_by - now).total_seconds()
    _note(
        job,
        f"Every rank of the job ({_count(job, silence)}) is silent: nobody can acknowledge "
        f"{command.kind} #{command.pk}, so the job is stopped from outside now, {waited:.0f} s "
        f"after it was issued instead of {left:.0f} s later"
        + (f". {_capital(silence.hang.describe())}" if silence.hang else ""),
        now,
        outcome.alert.pk,
        {"command_id": command.pk, "deadline_brought_forward_seconds": round(left, 3)},
    )
    return command.pk


def _say_paused_job_holds_nothing(job: Job, silence: Silence, now: datetime) -> None:
    alert = active_alert(job.pk, HEARTBEAT_RULE_KEY, "")
    if (
        alert is not None
        and TimelineEntry.objects.filter(alert_id=alert.pk, data__event=ALL_SILENT_EVENT).exists()
    ):
        return  # said once for this silence
    outcome = raise_or_update_alert(job.pk, heartbeat_signal(job, now), now=now)
    _note(
        job,
        f"Every rank of the paused job ({_count(job, silence)}) is silent: its processes are "
        "gone or hung, so nothing holds its state and a resume cannot reach them. Restart it "
        "from its checkpoint, or terminate it",
        now,
        outcome.alert.pk,
        {},
    )


def _note(job: Job, message: str, now: datetime, alert_id: int, data: dict) -> None:
    incident = active_incident(job.pk)
    if incident is not None:
        append_timeline(
            incident.pk,
            TimelineKind.NOTE,
            message,
            at=now,
            alert_id=alert_id,
            data={"event": ALL_SILENT_EVENT, "rule_key": HEARTBEAT_RULE_KEY, **data},
        )


def _count(job: Job, silence: Silence) -> str:
    return f"{len(silence.ranks)} of {job.world_size or len(silence.ranks)}"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]
