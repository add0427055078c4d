"""Several beats, one clock: Celery beat's scheduler behind a lease in Redis.

The beat is the clock of the watchdog: with one beat, a dead beat means no silent job is ever
caught. Run two or more (on different hosts): each follows the whole schedule, and only the
one holding the lease sends what is due. The holder renews the lease at every tick (at least
twice a second); when it dies, the lease runs out after ``LEASE_SECONDS`` and the next beat to
tick takes it over, so the watchdog misses at most that long plus a tick.

The lease is redis-py's lock (a key set with NX and an expiry, renewed by its owner), the
field's standard primitive. A beat that is not leading still advances its entries as if it had
sent them, so taking over sends what is due from then on, not a backlog (a daily digest sent
by the beat that led at 08:00 is not sent again by the one that leads at 09:00). A lease lost
to a pause longer than its expiry can let two beats send the same tick: every periodic task is
idempotent, so that costs work, never a double brake or page.

Celery's own choice of scheduler class is a setting (``CELERY_BEAT_SCHEDULER``); RedBeat, the
library that stores the schedule itself in Redis, was not taken: the console's Redis runs
without persistence, and RedBeat loses its schedule when Redis restarts empty until the next
beat restart, which would stop the watchdog exactly when Redis fails over.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any

from celery.beat import PersistentScheduler
from django.conf import settings
from redis.exceptions import LockError, RedisError

from core.redis_clients import redis_client

log = logging.getLogger(__name__)

LEASE_SECONDS = 2.0
TICK_SECONDS = 0.5  # the longest a beat sleeps between two ticks: renewals, take-overs


class LeasedScheduler(PersistentScheduler):
    """A beat that sends only while it holds the lease; see the module's doc."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.leading = False
        client = redis_client(socket_timeout=1.0, socket_connect_timeout=1.0)
        self.lease = client.lock(
            f"{settings.CHANNEL_PREFIX}:beat-lease", timeout=LEASE_SECONDS, thread_local=False
        )
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        self._hold_lease()
        return min(super().tick(*args, **kwargs), TICK_SECONDS)

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if self.leading:
            super().apply_entry(entry, producer=producer)

    def _hold_lease(self) -> None:
        was = self.leading
        try:
            if self.leading:
                self.lease.reacquire()  # renews its expiry; raises when another beat took it
            else:
                self.leading = bool(self.lease.acquire(blocking=False))
        except LockError:
            self.leading = False
        except RedisError:
            self.leading = False  # no broker either: nothing could be sent anyway
        if self.leading != was:
            log.warning(
                "beat %s (pid %d): %s the lease; %s",
                socket.gethostname(),
                os.getpid(),
                "took" if self.leading else "lost",
                "this beat sends the periodic tasks" if self.leading else "another beat sends them",
            )

    def close(self) -> None:
        if self.leading:
            with contextlib.suppress(LockError, RedisError):
                self.lease.release()  # a clean stop hands over at once
        super().close()
