"""The agent requests a web process holds and has not answered yet: its backlog.

Under overload a web process accepts agents' requests faster than it serves them: they wait in
its event loop and thread pool, and a heartbeat's deadline is stamped only when its transaction
finally runs. A process that holds a request has heard its agents only up to that request's
arrival, whatever its beacon's clock says; the beacon (``breakers.control.hearing``) reports
``now − oldest_age()``. Only the console's own time with a request counts: a client slow to
send its body is the client's delay (``Held.pause``), not a backlog, so an agent cannot stop the
watchdog by sending slowly.

Pure Python, no Django. Entering and leaving are O(1) on a dict under one lock held for a dict
operation; only the beacon, twice a second, looks at every entry.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable


class InFlight:
    """Requests in flight, each with the moment the process's time with it began."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._since: dict[int, float] = {}
        self._tickets = itertools.count()
        self._lock = threading.Lock()

    def enter(self, already: float = 0.0) -> int:
        """A request the process holds from now (``already``: seconds it held it before)."""
        ticket = next(self._tickets)
        since = self._clock() - already
        with self._lock:
            self._since[ticket] = since
        return ticket

    def leave(self, ticket: int) -> float:
        """The request is answered (or let go): the seconds since its ``enter``."""
        with self._lock:
            since = self._since.pop(ticket, None)
        return 0.0 if since is None else self._clock() - since

    def oldest_age(self) -> float:
        """Seconds the oldest request still held has waited (0.0: none held)."""
        with self._lock:
            oldest = min(self._since.values(), default=None)
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    def __len__(self) -> int:
        return len(self._since)

    def hold(self) -> Held:
        return Held(self)


class Held:
    """One request's hold, paused while the process waits on its client (the body)."""

    def __init__(self, in_flight: InFlight) -> None:
        self._in_flight = in_flight
        self._held = 0.0
        self._ticket: int | None = in_flight.enter()

    def pause(self) -> None:
        if self._ticket is not None:
            self._held += self._in_flight.leave(self._ticket)
            self._ticket = None

    def resume(self) -> None:
        if self._ticket is None:
            self._ticket = self._in_flight.enter(already=self._held)

    def release(self) -> None:
        self.pause()


# This process's agent requests: every front door that serves agents enters them here.
AGENT_REQUESTS = InFlight()

__all__ = ["AGENT_REQUESTS", "Held", "InFlight"]
