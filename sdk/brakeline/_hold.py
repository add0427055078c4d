"""The hold after a refused update: the guard kept a non-finite step out of the weights; at
the step boundary that follows, the run tells the console and waits for its rules to decide.

Said in this order: the "holding" heartbeat first (a console that knows every rank holds
applies its brake at the held step, not a margin of steps later; docs/protocol.md), then the
offending point, flushed at once (a NaN gradient need not show in any logged metric; the
default rule pack brakes on ``guard.skipped_updates``), then the wait: until a command arrives
(usually ``checkpoint_and_pause``, which saves this last good state) or ``guard_hold_seconds``
pass. Training thread only.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

from brakeline._commands import CommandInbox
from brakeline._encoding import LogRecord
from brakeline._guard import StepGuard
from brakeline._settings import Settings
from brakeline._state import RunState

logger = logging.getLogger("brakeline")

# How long a held rank waits for the console to take its "holding" heartbeat before it sends
# the offending point: bounded, since an older console refuses the status (the brake is then
# applied a margin of steps later, as before).
HOLDING_SAID_SECONDS = 2.0


class HoldChannel(Protocol):
    """What the hold says to the console (brakeline._link.ConsoleLink)."""

    @property
    def online(self) -> bool: ...

    def say_status(self, status: str, timeout: float) -> bool: ...

    def submit(self, record: LogRecord) -> bool: ...

    def flush(self, timeout: float) -> bool: ...


class GuardHold:
    """Holds the training thread after the guard refused an update (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        state: RunState,
        channel: HoldChannel,
        inbox: CommandInbox,
        guard: StepGuard,
    ) -> None:
        self._settings = settings
        self._state = state
        self._channel = channel
        self._inbox = inbox
        self._guard = guard

    def at_boundary(self) -> None:
        """At a step boundary: if the guard tripped since the last one, rewind the schedulers
        that stepped after the refused update, then hold for the console's decision."""
        if self._guard.tripped_step is None:
            return
        tripped = self._guard.take_trip()
        state = self._state
        if not self._channel.online or state.finished or state.stopping:
            return  # offline: the skipped update is all the guard can do
        previous = state.status
        state.status = "holding"
        timeout = min(self._settings.http_timeout, HOLDING_SAID_SECONDS)
        self._channel.say_status("holding", timeout)
        try:
            self._report(tripped)
            self._wait(tripped)
        finally:
            if state.status == "holding":
                state.status = previous

    def _report(self, tripped: int | None) -> None:
        step = tripped if tripped is not None else self._state.step
        refused = float(self._guard.refused_count())
        record = LogRecord(step=step, time=time.time(), metrics={"guard.skipped_updates": refused})
        self._channel.submit(record)
        settings = self._settings
        self._channel.flush(min(settings.guard_hold_seconds, settings.http_timeout))

    def _wait(self, tripped: int | None) -> None:
        state, inbox = self._state, self._inbox
        deadline = time.monotonic() + self._settings.guard_hold_seconds
        while not (state.finished or inbox.has_pending):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logger.error(
                    "brakeline: no console decision %.0f s after the non-finite step %s; "
                    "training goes on (that update was skipped)",
                    self._settings.guard_hold_seconds,
                    tripped,
                )
                return
            state.keepalive()  # held on purpose: heartbeats must not turn this into a hang
            inbox.wait(min(remaining, 0.25))
