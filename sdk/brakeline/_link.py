"""A run's link to the console: its metrics sender, its control loop and its push channel.

Three daemon threads move data between the network, the spill folder and the command inbox:
the metrics sender (batches, retries, spills), the control loop (heartbeats, acknowledgements,
checkpoint and snapshot reports) and the push listener (commands over the websocket, or the
node's forwarder). The training thread only queues: every method here returns at once except
the bounded waits that say so.

A run with no console configured holds an offline link: it sends nothing and waits for nothing,
so the rest of the run never asks whether it is online before it queues.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol

from brakeline._backoff import Backoff
from brakeline._commands import CommandInbox
from brakeline._control import ControlLoop
from brakeline._encoding import LogRecord
from brakeline._node import console_links
from brakeline._sender import MetricsSender
from brakeline._settings import Settings
from brakeline._spool import PointSpool, open_spill_directory
from brakeline._transport import Transport

logger = logging.getLogger("brakeline")


class PushChannel(Protocol):
    """Where pushed commands come from: a websocket listener, or the node's forwarder link."""

    def start(self) -> bool: ...

    def stop(self, timeout: float = ...) -> None: ...


class Outbox(Protocol):
    """Where reports go (checkpoints, acknowledgements): queued, delivered with retries."""

    def enqueue(self, key: str, path: str, body: bytes, urgent: bool = False) -> None: ...


class DeliveryOutbox(Outbox, Protocol):
    """An outbox that also says when a report reached the console (bounded wait)."""

    def wait_delivered(self, key: str, timeout: float) -> bool: ...


class ConsoleLink:
    """The run's three background threads, started and stopped together (see the module doc).
    Without a sender and a control loop the link is offline."""

    def __init__(
        self,
        sender: MetricsSender | None = None,
        control: ControlLoop | None = None,
        push: PushChannel | None = None,
        spill_lock: IO[str] | None = None,
    ) -> None:
        self.sender = sender
        self.control = control
        self.push = push
        self._spill_lock = spill_lock  # held while the run owns its spill folder
        self._snapshots_queued = 0
        self._snapshot_threads: list[threading.Thread] = []

    @property
    def online(self) -> bool:
        return self.control is not None

    def start(self) -> None:
        if self.sender is not None:
            self.sender.start()
        if self.control is not None:
            self.control.start()
        if self.push is not None:
            self.push.start()

    # -- the training thread's calls: they queue and return ---------------------------------------
    def submit(self, record: LogRecord) -> bool:
        """Queue one log record for the metrics sender; False when offline or full."""
        return self.sender is not None and self.sender.submit(record)

    def enqueue(self, key: str, path: str, body: bytes, urgent: bool = False) -> None:
        """Queue a report for the control loop, delivered with retries (once per ``key``)."""
        if self.control is not None:
            self.control.enqueue(key, path, lambda: body, urgent=urgent)

    def poke(self) -> None:
        """Send a heartbeat soon: the status changed."""
        if self.control is not None:
            self.control.poke()

    def queue_snapshot(self, kind: str, step: int, build: Callable[[], bytes | None]) -> None:
        """Build an environment snapshot in a thread of its own and queue it: scanning the
        packages takes a tenth of a second or more, which must delay neither training nor
        heartbeats and acknowledgements. ``build`` returns None when the snapshot failed."""
        control = self.control
        if control is None:
            return
        self._snapshots_queued += 1
        key = f"snapshot:{kind}:{step}:{self._snapshots_queued}"

        def build_and_queue() -> None:
            encoded = build()
            if encoded is not None:
                control.enqueue(key, "snapshots", lambda: encoded)

        thread = threading.Thread(target=build_and_queue, name="brakeline-snapshot", daemon=True)
        self._snapshot_threads.append(thread)
        thread.start()

    # -- bounded waits ---------------------------------------------------------------------------
    def say_status(self, status: str, timeout: float) -> bool:
        """Send a heartbeat now and wait (bounded) until one saying ``status`` was taken."""
        return self.control is not None and self.control.say_status(status, timeout)

    def wait_delivered(self, key: str, timeout: float) -> bool:
        """Wait (bounded) until the report queued as ``key`` reached the console."""
        return self.control is not None and self.control.wait_delivered(key, timeout)

    def flush(self, timeout: float) -> bool:
        """Wait (bounded) until queued metrics are delivered; True if nothing is pending."""
        return self.sender is None or self.sender.flush(timeout)

    def stop(self, timeout: float) -> None:
        """Deliver what can be delivered within ``timeout``, send the final heartbeat (the
        run's status says finished by now), stop the threads, let go of the spill folder."""
        if self.sender is not None:
            self.sender.stop(timeout / 2)
        if self.control is not None:
            for thread in self._snapshot_threads:
                thread.join(timeout=1.0)
            self.control.poke()
            self.control.stop(timeout / 2)
        if self.push is not None:
            self.push.stop()
        if self._spill_lock is not None:
            self._spill_lock.close()


def open_link(
    settings: Settings,
    inbox: CommandInbox,
    heartbeat_body: Callable[[], dict[str, Any] | None],
    rank_named: bool,
    transport: Transport | None = None,
) -> ConsoleLink:
    """The run's link, not started yet: through the node's forwarder, its own HTTP and
    websocket conversation, or ``transport`` when given; offline when no console is
    configured. ``rank_named``: the websocket names this rank (multi-rank)."""
    transport, push = console_links(settings, inbox, rank_named, transport)
    if transport is None:
        logger.warning(
            "brakeline: no console configured (BRAKELINE_URL, BRAKELINE_TOKEN); "
            "running offline: metrics are not sent, no commands arrive"
        )
        return ConsoleLink()
    spool, spill_lock = _open_spool(settings)
    sender = MetricsSender(
        transport,
        spool,
        settings.node,
        inbox.offer_all,
        flush_interval=settings.flush_interval,
        max_queue_records=settings.max_queue_records,
        backoff=Backoff(settings.backoff_base, settings.backoff_cap),
        max_retry_after=settings.max_retry_after,
    )
    control = ControlLoop(
        transport,
        inbox,
        heartbeat_body,
        settings.heartbeat_interval,
        backoff=Backoff(settings.backoff_base, settings.backoff_cap),
    )
    sender.heartbeats = control  # a due heartbeat rides in the next batch
    return ConsoleLink(sender, control, push, spill_lock)


def _open_spool(settings: Settings) -> tuple[PointSpool, IO[str] | None]:
    spill_lock = None
    try:
        directory, spill_lock = open_spill_directory(
            settings.spill_dir, settings.job, settings.rank
        )
    except OSError as error:
        directory = Path(tempfile.mkdtemp(prefix="brakeline-spill-"))
        logger.warning("brakeline: spill folder unusable (%s); using %s", error, directory)
    spool = PointSpool(
        directory,
        settings.batch_points,
        settings.batch_bytes,
        settings.max_memory_points,
        settings.max_spill_bytes,
        rank=settings.rank,
    )
    return spool, spill_lock
