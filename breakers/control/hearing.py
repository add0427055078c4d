"""Whether the console could hear its agents: the web tier's beacon.

A job's silence means something only while the console was able to hear it. Every web process
writes a beacon about twice a second (one row, on the database's clock). The watchdog judges
heartbeat deadlines and acknowledgement deadlines only up to the last beacon: while the web
tier is stopped, or cannot write what its agents say (its database away), no deadline runs
out. The first beacon after such a deafness moves every deadline that was running during it by
the deafness's length, in the same transaction, so the time the console could not hear is
nobody's silence: a healthy job is not paused or killed because the console was down, and a
job that really hung during the outage is still caught, one full deadline after the return.

What the beacon cannot see: agents cut off from a web tier that is itself fine (a proxy or
network between them down). That silence is the job's as far as the console can know.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, connections, transaction
from django.db.models import F
from django.db.models.functions import Now

from breakers.models import OPEN_COMMAND_STATUSES, Command, Hearing
from incidents.models import Job, JobRank

log = logging.getLogger(__name__)

BEACON_SECONDS = 0.5
# A gap between two beacons longer than this was deafness (a loaded web process still writes
# its beacon every half second or so; four missed ones are not load).
DEAF_AFTER_SECONDS = 2.0
ROW = 1


def beacon() -> float:
    """One web process's beacon; returns the seconds of deafness it ends (0.0: none)."""
    with transaction.atomic():
        row = Hearing.objects.select_for_update().filter(pk=ROW).annotate(now=Now()).first()
        if row is None:
            _first_beacon()
            return 0.0
        now: datetime = row.now
        gap = (now - row.heard_at).total_seconds()
        if gap <= DEAF_AFTER_SECONDS:
            Hearing.objects.filter(pk=ROW).update(heard_at=now)
            return 0.0
        forgive_deafness(row.heard_at, now)
        Hearing.objects.filter(pk=ROW).update(
            heard_at=now,
            heard_since=now,
            outages=F("outages") + 1,
            deaf_seconds=F("deaf_seconds") + gap,
            last_gap_seconds=gap,
        )
    log.warning(
        "the console could not hear its agents for %.1f s (its web tier was away or could not "
        "write): deadlines that ran meanwhile were moved by that much",
        gap,
    )
    return gap


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
    """Up to when a silence is the job's own: ``now``, or the last beacon when it is older."""
    if not settings.JUDGE_SILENCE_BY_BEACON:
        return now
    heard = Hearing.objects.filter(pk=ROW).values_list("heard_at", flat=True).first()
    return now if heard is None else min(now, heard)


def heard_since() -> datetime | None:
    """The end of the console's last deafness (None: never deaf, or no beacon yet)."""
    if not settings.JUDGE_SILENCE_BY_BEACON:
        return None
    row = Hearing.objects.filter(pk=ROW, outages__gt=0).values_list("heard_since", flat=True)
    return row.first()


def hearing_state() -> dict[str, float | int | None]:
    """For /api/v1/health and /metrics: the beacon's age on the database's clock, outages."""
    row = Hearing.objects.filter(pk=ROW).annotate(now=Now()).first()
    if row is None:
        return {"age_seconds": None, "outages": 0, "deaf_seconds": 0.0}
    age = (row.now - row.heard_at).total_seconds()
    return {"age_seconds": age, "outages": row.outages, "deaf_seconds": row.deaf_seconds}


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
    "BEACON_SECONDS",
    "DEAF_AFTER_SECONDS",
    "beacon",
    "forgive_deafness",
    "hearing_state",
    "heard_since",
    "heard_until",
    "start_beacon",
]
