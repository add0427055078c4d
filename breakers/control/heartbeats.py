"""The heartbeat watchdog: a job whose agent went silent past its deadline is braked (L3).

One query per tick finds the overdue jobs: each rank has its own deadline (``JobRank``,
written by that rank's heartbeats alone, without the job's row lock), and a job is overdue
when one of its ranks is past it (``incidents.heartbeats.past_deadline``: the job's own
``heartbeat_deadline``, never later than its earliest rank's, narrows the search through its
index), so one silent rank among heartbeating ones is found, and named, by the same query.
Paused jobs are watched too: their ranks heartbeat while they hold. Each silence raises its
alert once — the claim on ``heartbeat_overdue_since`` is a compare-and-swap, so two watchdogs
never both raise it — and the heartbeat that leaves no rank overdue clears it
(``incidents.heartbeats.record_heartbeat``). The alert's action is checkpoint_and_pause: a job that
is merely slow answers it; a hung one does not, its command expires, and the executor stops
it from the outside. A paused job is not paused again: its alert calls a person.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from breakers.control.braking import brake_for_alert
from breakers.control.hang import Hang, RankPlace, attribute_hang, name_hosts, name_ranks
from breakers.control.hearing import heard_until
from breakers.detection import shadow
from breakers.detection.evaluation import report_failing_breakers
from breakers.models import ShadowFiring
from core.transient import TRANSIENT_ERRORS
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.heartbeats import HEARTBEAT_RULE_KEY, heartbeat_timeout_seconds, past_deadline
from incidents.models import LIVE_JOB_STATUSES, Job, JobRank, JobStatus
from incidents.notifications.rounds import notify_alert

log = logging.getLogger(__name__)

# Paused jobs too: a paused rank goes on heartbeating ("paused"), so silence there is a rank
# that died or hung in a collective while the others hold.
WATCHED_STATUSES = LIVE_JOB_STATUSES
# Silent ranks (and their hosts) named in the alert; the rest are counted: the ranks table
# sorts the silent first for the whole list.
SILENT_NAMED = 2
SHADOW_BATCH = 200  # episodes closed per tick: the next tick takes the rest


@dataclass(frozen=True)
class Silence:
    """Who went silent: the ranks past their deadline (none for a job whose heartbeats
    predate per-rank records: then the job's own last heartbeat)."""

    since: datetime  # the earliest last heartbeat among the silent
    step: int
    step_time: float | None  # the silent ranks' slowest measured step time
    ranks: tuple[JobRank, ...]
    others: int  # ranks still heartbeating
    # The rank(s) the others wait for, when their last words tell them apart: what the alert
    # names and what its nodes are.
    hang: Hang | None = None


def silence_of(job: Job, now: datetime) -> Silence:
    ranks = list(JobRank.objects.filter(job=job).order_by("rank"))
    silent = tuple(r for r in ranks if r.heartbeat_deadline and r.heartbeat_deadline < now)
    others = sum(1 for r in ranks if r.heartbeat_deadline and r.heartbeat_deadline >= now)
    if not silent:
        # Only jobs that heartbeated have a deadline, so only they are ever overdue.
        assert job.last_heartbeat_at is not None
        return Silence(job.last_heartbeat_at, job.last_heartbeat_step or 0, None, (), others)
    step_times = [r.step_time_seconds for r in silent if r.step_time_seconds]
    unfinished = [r for r in ranks if r.heartbeat_deadline is not None]
    hang = attribute_hang([_place(r) for r in unfinished], job.world_size)
    return Silence(
        since=min(r.last_heartbeat_at for r in silent),
        step=min(r.step for r in silent),
        step_time=max(step_times) if step_times else None,
        ranks=silent,
        others=others,
        hang=hang if hang and _explains(hang, {r.rank for r in silent}) else None,
    )


def _explains(hang: Hang, silent: set[int]) -> bool:
    """Every other rank is silent or said it waits in a collective the hung ones never
    entered (a rank still making progress waits for nobody), and all are within a step of
    them, as ranks in lock-step are. The hung ones may not be past their deadline yet: the
    last word of a rank that entered a sync and then hung can be later than the others'."""
    lowest = min(h.step for h in hang.hung)
    return all((w.rank in silent or w.in_next_sync) and w.step <= lowest + 1 for w in hang.waiting)


def every_rank_silent(job: Job, silence: Silence) -> bool:
    """Every rank the job runs has heartbeated and is past its deadline, none still beating."""
    if not silence.ranks or silence.others:
        return False
    return len(silence.ranks) >= (job.world_size or len(silence.ranks))


def _place(seat: JobRank) -> RankPlace:
    return RankPlace(seat.rank, seat.step, seat.sync_step, seat.hostname, seat.pid)


def _who(silence: Silence, job: Job) -> str:
    """ "rank 2 of 4 is hung (…); ranks 0, 1, 3 wait on it …", else the silent ranks counted
    against the job's size, a few named ("rank 713 of 1,000 is silent (gpu-89, pid 77); 999
    other ranks still heartbeating", "ranks 12, 713 and 5 more of 1,000 are silent (…)"), or
    "" for one process. A thousand silent ranks make one line, not a thousand names."""
    if not silence.ranks or ((job.world_size or 1) == 1 and silence.ranks[0].rank == 0):
        return ""
    if silence.hang is not None:
        return f"{silence.hang.describe()}: "
    places = [_place(r) for r in silence.ranks]
    world = max(job.world_size or 0, len(silence.ranks) + silence.others)
    verb = "are" if len(places) > 1 else "is"
    others = silence.others
    rest = (
        f"; {others:,} other rank{'s' if others > 1 else ''} still heartbeating" if others else ""
    )
    named, hosts = name_ranks(places, SILENT_NAMED), name_hosts(places, SILENT_NAMED)
    return f"{named} of {world:,} {verb} silent ({hosts}){rest}: "


def heartbeat_signal(job: Job, now: datetime) -> AlertSignal:
    silence = silence_of(job, now)
    timeout = heartbeat_timeout_seconds(job, silence.step_time)
    silent = (now - silence.since).total_seconds()
    step_time = silence.step_time or job.step_time_seconds
    basis = (
        f"8× the measured step time {step_time:.3g} s"
        if step_time and not job.heartbeat_timeout_seconds
        else "the job's timeout"
    )
    paused = job.status == JobStatus.PAUSED
    gone = (
        "; every rank is silent: its processes are gone or hung, a resume cannot reach them"
        if paused and every_rank_silent(job, silence) and len(silence.ranks) > 1
        else ""
    )
    return AlertSignal(
        rule_key=HEARTBEAT_RULE_KEY,
        rule_name="Heartbeat timeout",
        layer="health",
        severity="L3",
        metric="heartbeat",
        node="",
        value=silent,
        threshold=timeout,
        description=f"{_who(silence, job)}no heartbeat for {silent:.1f} s "
        f"(timeout {timeout:.3g} s, {basis}){' while paused' if paused else ''}{gone}; "
        f"last step {silence.step}",
        step=silence.step,
        time=now,
        first_step=silence.step,
        first_time=silence.since,
        duration_seconds=silent,
        # A paused job is not paused again: the alert calls a person (and the executor).
        action="none" if paused else "checkpoint_and_pause",
        nodes=_nodes(silence),
        runbook_hint="hung_no_logs",
    )


def _nodes(silence: Silence) -> tuple[str, ...]:
    """The hung ranks' hosts (what to drain), else every silent rank's."""
    if silence.hang is not None:
        return tuple(dict.fromkeys(h.host for h in silence.hang.hung if h.host))
    return tuple(dict.fromkeys(r.hostname for r in silence.ranks if r.hostname))


def observed_only(job: Job) -> bool:
    """The job's team put the watchdog's rule in shadow mode (docs/rules.md): its silences are
    recorded as what the rule would have done; no alert, no brake, no page."""
    return shadow.shadow_rule(job.team_id, HEARTBEAT_RULE_KEY) is not None


def close_heard_episodes(now: datetime) -> int:
    """Close the watchdog rule's open shadow episodes that ended: the job was heard from again
    (a heartbeat cleared its silence's claim), or the rule went live — then the claim is
    released too, so this tick's check raises the live alert of a silence still going on.
    Returns how many closed."""
    episodes = ShadowFiring.objects.filter(rule_key=HEARTBEAT_RULE_KEY, cleared_at__isnull=True)
    closed = 0
    for episode in list(episodes.select_related("job").order_by("pk")[:SHADOW_BATCH]):
        job = episode.job
        heard = job.heartbeat_overdue_since is None
        if not heard and observed_only(job):
            continue  # still silent, still observed
        reason = "heartbeats came back" if heard else "the rule went live"
        step = job.last_heartbeat_step if heard else None
        with transaction.atomic():
            closed += shadow.close_firing(
                job.pk, HEARTBEAT_RULE_KEY, "", reason=reason, step=step, at=now.timestamp()
            )
            if not heard:
                Job.objects.filter(
                    pk=job.pk, heartbeat_overdue_since=job.heartbeat_overdue_since
                ).update(heartbeat_overdue_since=None)
    return closed


def overdue_jobs(now: datetime) -> list[Job]:
    return list(
        Job.objects.filter(
            past_deadline(now),
            heartbeat_overdue_since__isnull=True,
            status__in=WATCHED_STATUSES,
        ).order_by("heartbeat_deadline")
    )


def check_heartbeats(now: datetime | None = None) -> list[int]:
    """Raise (once) the L3 heartbeat alert of every overdue job; returns their alert ids."""
    now = now or timezone.now()
    heard = heard_until(now)  # the console's own deafness is nobody's silence
    close_heard_episodes(now)
    raised = []
    for job in overdue_jobs(heard):
        try:
            alert_id = _raise_heartbeat_alert(job, now, heard)
        except TRANSIENT_ERRORS:
            raise  # the console's database, Redis or broker, not this job: the next tick tries
            # every job again (a page whose dispatch was lost is sent by the delivery sweep)
        except Exception as error:
            # This job's alone, as an evaluation's error is (its L3 "breakers failing",
            # paged): the other jobs' silences are still judged in this tick.
            log.exception("heartbeat check of job %s failed", job.pk)
            report_failing_breakers(job.pk, error)
            continue
        if alert_id is not None:
            raised.append(alert_id)
    return raised


def _raise_heartbeat_alert(job: Job, now: datetime, heard: datetime) -> int | None:
    """Claim the job's silence and raise its alert (and brake) in one transaction: None when
    another watchdog claimed it first, or a heartbeat arrived meanwhile (or the deadline moved:
    the console had been deaf)."""
    with transaction.atomic():
        claimed = Job.objects.filter(
            past_deadline(heard), pk=job.pk, heartbeat_overdue_since__isnull=True
        ).update(heartbeat_overdue_since=now)
        if not claimed:
            return None
        signal = heartbeat_signal(job, now)
        if observed_only(job):  # what it would have done, and nothing more
            shadow.record_signal(job.pk, HEARTBEAT_RULE_KEY, signal)
            return None
        outcome = raise_or_update_alert(job.pk, signal, now=now)
        if outcome.action_due:
            brake_for_alert(outcome.alert)
            notify_alert(outcome.alert.pk)  # after commit
        return outcome.alert.pk
