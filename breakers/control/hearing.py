"""Whether the console could hear its agents: the web tier's beacon.

A job's silence means something only while the console was able to hear it. Every web process
writes a beacon about twice a second (one row, on the database's clock). The watchdog judges
heartbeat deadlines and acknowledgement deadlines only up to the last beacon: while the web
tier is stopped, or cannot write what its agents say (its database away), no deadline runs
out. The first beacon after such a deafness moves every deadline that was running during it by
the deafness's length, in the same transaction, so the time the console could not hear is
nobody's silence: a healthy job is not paused or killed because the console was down, and a
job that really hung during the outage is still caught, one full deadline after the return.

A web process can also hear late while it beacons on time: overloaded, it accepts its agents'
requests faster than it serves them, and a heartbeat's deadline is stamped only when its
transaction runs. So each process says, in its own row, up to when it has heard: its beacon
less the age of the oldest agent request it holds unserved (``breakers.control.backlog``), once
that age is a backlog (over a second). The console has heard up to the earliest of its live
processes — a backlogged web tier is partially deaf — and a process whose beacon stopped (its
requests died with it; the agents retry elsewhere) stops counting after the same two seconds
that make a gap deafness. When a backlog clears, or its process is found dead, the deadlines
still running are moved by its worst lag, as after a deafness.

What the beacon cannot see: agents cut off from a web tier that is itself fine (a proxy or
network between them down). That silence is the job's as far as the console can know.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import F, Max, Min
from django.db.models.functions import Now

from breakers.control.backlog import AGENT_REQUESTS
from breakers.models import OPEN_COMMAND_STATUSES, Command, Hearing, WebBeacon
from incidents.models import Job, JobRank

log = logging.getLogger(__name__)

BEACON_SECONDS = 0.5
# A gap between two beacons longer than this was deafness (a loaded web process still writes
# its beacon every half second or so; four missed ones are not load). A process whose own
# beacon is this much older than the tier's is gone: its held requests died with it.
DEAF_AFTER_SECONDS = 2.0
# A held agent request older than this is a backlog (a request is served in milliseconds; a
# second is load): the process has heard only up to its arrival.
BACKLOG_AFTER_SECONDS = 1.0
# A held request counts at most this long: one stuck for good (a lock never released, a bug)
# must not stop the watchdog judging every job; past it, deadlines run again, this far behind.
BACKLOG_AT_MOST_SECONDS = 60.0
ROW = 1
# This process's row of the beacon (WebBeacon): the host, the pid, and a nonce for a pid reused.
PROCESS = f"{socket.gethostname()[:60]}:{os.getpid()}:{secrets.token_hex(4)}"


def beacon() -> float:
    """One web process's beacon; returns the seconds of deafness it forgives (0.0: none): the
    whole tier's gap, or a backlog that cleared (a process's, or a dead process's)."""
    lag = backlog_lag(AGENT_REQUESTS.oldest_age())
    with transaction.atomic():
        row = Hearing.objects.select_for_update().filter(pk=ROW).annotate(now=Now()).first()
        if row is None:
            _first_beacon()  # this process's row comes with its next beacon
            return 0.0
        now: datetime = row.now
        gap = (now - row.heard_at).total_seconds()
        deaf_since = row.heard_at if gap > DEAF_AFTER_SECONDS else None
        since = _earliest(deaf_since, _bury_dead_processes(now), _record_process(now, lag))
        if since is None:
            Hearing.objects.filter(pk=ROW).update(heard_at=now)
            return 0.0
        forgiven = (now - since).total_seconds()
        forgive_deafness(since, now)
        Hearing.objects.filter(pk=ROW).update(
            heard_at=now,
            heard_since=now,
            outages=F("outages") + 1,
            deaf_seconds=F("deaf_seconds") + forgiven,
            last_gap_seconds=forgiven,
        )
    log.warning(
        "the console could not hear its agents for %.1f s (its web tier was away, could not "
        "write, or held their requests unserved): deadlines that ran meanwhile were moved by "
        "that much",
        forgiven,
    )
    return forgiven


def backlog_lag(oldest_age: float) -> float:
    """How far behind the clock this process has heard: the oldest held request's age once it
    is a backlog (at most BACKLOG_AT_MOST_SECONDS), else nothing (service times are far below
    the threshold)."""
    if oldest_age <= BACKLOG_AFTER_SECONDS:
        return 0.0
    return min(oldest_age, BACKLOG_AT_MOST_SECONDS)


def _earliest(*moments: datetime | None) -> datetime | None:
    return min((m for m in moments if m is not None), default=None)


def _record_process(now: datetime, lag: float) -> datetime | None:
    """This process's row: heard up to ``now − lag``. Returns the start of the unheard time
    to forgive when its backlog just cleared (its worst lag before now), else None."""
    previous = WebBeacon.objects.filter(pk=PROCESS).values_list("peak_lag_seconds", flat=True)
    peak = previous.first() or 0.0
    cleared = peak > 0 and not lag
    WebBeacon.objects.update_or_create(
        pk=PROCESS,
        defaults={
            "beat_at": now,
            "heard_to": now - timedelta(seconds=lag),
            "lag_seconds": lag,
            "peak_lag_seconds": 0.0 if cleared else max(peak, lag),
        },
    )
    return now - timedelta(seconds=peak) if cleared else None


def _bury_dead_processes(now: datetime) -> datetime | None:
    """Remove the rows of processes that stopped beaconing; returns where the earliest
    backlogged one's unheard time began (its last beacon less its worst lag: its requests died
    with it, and the agents retry elsewhere, later than their deadlines may allow), or None."""
    dead = WebBeacon.objects.filter(beat_at__lt=now - timedelta(seconds=DEAF_AFTER_SECONDS))
    backlogged = dead.filter(peak_lag_seconds__gt=0).values_list("beat_at", "peak_lag_seconds")
    since = _earliest(*(beat - timedelta(seconds=peak) for beat, peak in backlogged))
    dead.delete()
    return since


def _first_beacon() -> None:
    try:
        with transaction.atomic():  # another web process may write the first one too
            Hearing.objects.create(pk=ROW, heard_at=Now(), heard_since=Now())
    except IntegrityError:
        pass


def forgive_deafness(since: datetime, until: datetime) -> None:
    """Deadlines that ran while the console was deaf (from ``since`` to ``until``) move by
    the deafness: heartbeat deadlines of jobs and ranks last heard before it, and the
    acknowledgement deadlines of open commands (a command issued during it, by a worker that
    could still evaluate, gets its whole window from ``until``)."""
    gap = until - since
    # Heard before the deafness: up to the last beacon, and in the moment between it and the
    # web tier's death (up to a beacon period); nothing can be heard in the middle of the gap,
    # and a heartbeat that landed just before this beacon keeps its own fresh deadline.
    heard_before = {"heartbeat_deadline__gt": since, "last_heartbeat_at__lt": since + gap / 2}
    Job.objects.filter(**heard_before).update(heartbeat_deadline=F("heartbeat_deadline") + gap)
    JobRank.objects.filter(**heard_before).update(heartbeat_deadline=F("heartbeat_deadline") + gap)
    open_commands = Command.objects.filter(status__in=OPEN_COMMAND_STATUSES, deliver_by__gt=since)
    open_commands.filter(issued_at__lte=since).update(deliver_by=F("deliver_by") + gap)
    for command_id, issued, deadline in open_commands.filter(issued_at__gt=since).values_list(
        "pk", "issued_at", "deliver_by"
    ):
        Command.objects.filter(pk=command_id).update(deliver_by=until + (deadline - issued))


def heard_until(now: datetime) -> datetime:
    """Up to when a silence is the job's own: ``now``, the last beacon when it is older, or the
    point a live web process's backlog has heard up to when that is older still."""
    if not settings.JUDGE_SILENCE_BY_BEACON:
        return now
    heard = Hearing.objects.filter(pk=ROW).values_list("heard_at", flat=True).first()
    if heard is None:
        return now
    # The processes still beaconing; a backlogged one has heard only up to its oldest request.
    live = WebBeacon.objects.filter(beat_at__gte=heard - timedelta(seconds=DEAF_AFTER_SECONDS))
    laggard = live.aggregate(heard_to=Min("heard_to"))["heard_to"]
    return min(now, heard, laggard or heard)


def heard_since() -> datetime | None:
    """The end of the console's last deafness (None: never deaf, or no beacon yet)."""
    if not settings.JUDGE_SILENCE_BY_BEACON:
        return None
    row = Hearing.objects.filter(pk=ROW, outages__gt=0).values_list("heard_since", flat=True)
    return row.first()


def forgiven_so_far() -> float:
    """All the deafness the console has forgiven so far, in seconds (deadlines moved by it)."""
    row = Hearing.objects.filter(pk=ROW).values_list("deaf_seconds", flat=True).first()
    return float(row or 0.0)


def hearing_state() -> dict[str, float | int | None]:
    """For /api/v1/health and /metrics: the beacon's age on the database's clock, outages, and
    the worst backlog of a live web process."""
    row = Hearing.objects.filter(pk=ROW).annotate(now=Now()).first()
    if row is None:
        return {"age_seconds": None, "outages": 0, "deaf_seconds": 0.0, "backlog_seconds": 0.0}
    age = (row.now - row.heard_at).total_seconds()
    live = WebBeacon.objects.filter(
        beat_at__gte=row.heard_at - timedelta(seconds=DEAF_AFTER_SECONDS)
    )
    backlog = live.aggregate(lag=Max("lag_seconds"))["lag"] or 0.0
    return {
        "age_seconds": age,
        "outages": row.outages,
        "deaf_seconds": row.deaf_seconds,
        "backlog_seconds": backlog,  # the most backlogged live web process's lag
    }


def _beat_forever(stop: threading.Event) -> None:
    failing_since: float | None = None
    while not stop.wait(BEACON_SECONDS):
        try:
            beacon()
            failing_since = None
        except Exception:
            # The database is away: that is deafness, measured by the first beacon after it.
            if failing_since is None:
                failing_since = time.monotonic()
                log.warning("hearing beacon: cannot write (database away?)", exc_info=True)
            connections["default"].close()  # a fresh connection on the next try


def start_beacon() -> threading.Event:
    """Start this web process's beacon thread; set the returned event to stop it."""
    stop = threading.Event()
    thread = threading.Thread(target=_beat_forever, args=(stop,), name="hearing", daemon=True)
    thread.start()
    return stop


__all__ = [
    "BACKLOG_AFTER_SECONDS",
    "BEACON_SECONDS",
    "DEAF_AFTER_SECONDS",
    "PROCESS",
    "backlog_lag",
    "beacon",
    "forgive_deafness",
    "forgiven_so_far",
    "hearing_state",
    "heard_since",
    "heard_until",
    "start_beacon",
]
