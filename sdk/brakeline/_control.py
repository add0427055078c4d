"""The control thread: heartbeats, command acknowledgements and environment snapshots.

Thread-safety: the training thread only calls :meth:`ControlLoop.enqueue`, :meth:`poke` and
:meth:`wait_delivered`; the outbox is a deque (atomic append/popleft) and delivery is announced
through a Condition. Heartbeat content comes from a callable that reads plain attributes of the
run (atomic reads), so the training thread is never locked by this thread.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from brakeline._backoff import Backoff
from brakeline._commands import CommandInbox
from brakeline._transport import Response, Transport, TransportError, encode_json

logger = logging.getLogger("brakeline")

# Answers after which retrying an ack or snapshot is pointless (it is logged and dropped).
RETRYABLE_STATUSES = {401, 408, 425, 429}
# An item the console answered 500 (not an outage: 502/503/504) this many times in a row is
# dropped like a 4xx, so it cannot hold back the items behind it.
MAX_SERVER_ERRORS_PER_ITEM = 5
OUTAGE_STATUSES = {502, 503, 504}
# The protocol version from which a console takes a heartbeat inside a metrics batch.
HEARTBEAT_IN_BATCH_PROTOCOL = 3
# The status the console ends a job on: from then on it closes the job's open commands as never
# applied, so an acknowledgement that reaches it afterwards no longer counts.
FINAL_STATUS = "finished"


@dataclasses.dataclass
class OutboxItem:
    """A POST that must reach the console once; the body is built lazily in this thread."""

    key: str
    path: str
    make_body: Callable[[], Any]
    body: bytes | None = None

    def encoded(self) -> bytes:
        if self.body is None:
            made = self.make_body()
            self.body = made if isinstance(made, bytes) else encode_json(made)
        return self.body


def _settled(response: Response | None) -> bool:
    """Delivered, or refused in a way that retrying cannot change."""
    if response is None:
        return False
    return response.ok or (response.status < 500 and response.status not in RETRYABLE_STATUSES)


class ControlLoop:
    """Sends heartbeats every ``interval`` and delivers the outbox as soon as it can."""

    def __init__(
        self,
        transport: Transport,
        inbox: CommandInbox,
        heartbeat_body: Callable[[], dict[str, Any] | None],
        interval: float = 5.0,
        backoff: Backoff | None = None,
    ) -> None:
        self.transport = transport
        self.inbox = inbox
        self.interval = interval
        self.heartbeats_sent = 0
        self._heartbeat_body = heartbeat_body
        self._backoff = backoff or Backoff()
        # Two queues: acknowledgements go first so a pause is never confirmed late because a
        # snapshot is queued in front of it.
        self._urgent: collections.deque[OutboxItem] = collections.deque()
        self._outbox: collections.deque[OutboxItem] = collections.deque()
        self._delivered: set[str] = set()
        self._delivery = threading.Condition()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._heartbeat_wanted = threading.Event()
        self._next_heartbeat = 0.0
        self._next_outbox_attempt = 0.0
        self._warned_auth = False
        self._warned_refused = False
        self._status_delivered: str | None = None  # of the last heartbeat taken (say_status)
        self._server_errors: dict[str, int] = {}  # consecutive 500s per outbox item
        # The heartbeat schedule is shared with the metrics thread (ride): taken under a lock.
        self._schedule = threading.Lock()
        self._console_protocol = 0  # of the last answer seen; heartbeats ride from 3 on
        self._unsent_heartbeat: dict[str, Any] | None = None  # rode in a batch that failed
        self._thread = threading.Thread(target=self._run, name="brakeline-control", daemon=True)

    # -- called from other threads ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def enqueue(
        self, key: str, path: str, make_body: Callable[[], Any], urgent: bool = False
    ) -> None:
        queue = self._urgent if urgent else self._outbox
        queue.append(OutboxItem(key=key, path=path, make_body=make_body))
        self._wake.set()

    def poke(self) -> None:
        """Send a heartbeat now (the status changed: paused, checkpointing, finished)."""
        self._heartbeat_wanted.set()
        self._wake.set()

    def say_status(self, status: str, timeout: float) -> bool:
        """Send a heartbeat now and wait (bounded) until one saying ``status`` was taken: the
        console must know it before what the caller sends next (a held rank, before its NaN
        point: the console applies its brake where every rank holds)."""
        with self._delivery:
            self._status_delivered = None
        self.poke()
        deadline = time.monotonic() + timeout
        with self._delivery:
            while self._status_delivered != status:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._delivery.wait(remaining)
        return True

    def wait_delivered(self, key: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._delivery:
            while key not in self._delivered:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._delivery.wait(remaining)
        return True

    def stop(self, timeout: float) -> None:
        """One last delivery round (outbox, then a final heartbeat), bounded by timeout."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)

    # -- the control thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._wake.wait(self._seconds_to_wait())
                self._wake.clear()
                self._tick(time.monotonic())
            except Exception:  # never let this thread die or reach training
                logger.exception("brakeline: control thread error (continuing)")
                self._stopping.wait(self._backoff.next_delay())
        try:
            self._deliver(final=True)
            self._send_heartbeat(final=True)
        except Exception:
            logger.exception("brakeline: final heartbeat failed")

    def _seconds_to_wait(self) -> float:
        now = time.monotonic()
        due = self._next_heartbeat
        if self._urgent or self._outbox:
            due = min(due, self._next_outbox_attempt)
        return max(0.0, min(due - now, self.interval))

    def _tick(self, now: float) -> None:
        if (self._urgent or self._outbox) and now >= self._next_outbox_attempt:
            self._deliver(final=False)
            now = max(now, time.monotonic())  # a heartbeat may have come due meanwhile
        with self._schedule:
            due = self._heartbeat_wanted.is_set() or now >= self._next_heartbeat
            if due:
                self._heartbeat_wanted.clear()
                self._next_heartbeat = now + self.interval
        if due:
            self._send_heartbeat()

    # -- called from the metrics thread ----------------------------------------------------------
    def ride(self, within: float) -> dict[str, Any] | None:
        """The heartbeat due within ``within`` seconds (before the sender's next batch), taken
        off this loop's schedule to travel inside the batch about to leave; None when none is
        due, when one is wanted at once (a status change goes on its own, now), or when the
        console has not said it takes heartbeats in batches."""
        if self._console_protocol < HEARTBEAT_IN_BATCH_PROTOCOL:
            return None
        with self._schedule:
            now = time.monotonic()
            if self._heartbeat_wanted.is_set() or now + within < self._next_heartbeat:
                return None
            self._next_heartbeat = now + self.interval
        body = self._heartbeat_body()
        return None if body is not None and self._holds_back(body) else body

    def rode(self, heartbeat: dict[str, Any], response: Response | None) -> None:
        """How the batch carrying ``heartbeat`` was answered: taken (as a heartbeat's own
        reply; the sender hands the commands to the inbox), or not (this loop sends one
        itself at once, as it would have)."""
        if response is not None:
            self._console_protocol = response.protocol
        if response is not None and response.ok:
            self._heartbeat_taken(heartbeat)
        else:
            # Sent again by this loop, at once: without progress since, the body it would
            # build is None (that progress was this heartbeat's to report).
            self._unsent_heartbeat = heartbeat
            self.poke()

    def _deliver(self, final: bool) -> None:
        """The acknowledgements, then the other reports one at a time: an ack queued meanwhile
        goes next, and (outside the last round) a heartbeat that came due goes between two
        reports. A run that checkpoints every few steps queues reports faster than a loaded
        console takes them: drained in one go, they would hold back acks and heartbeats."""
        while True:
            if not self._deliver_queue(self._urgent, final):
                return
            if not self._outbox:
                break
            if not self._deliver_queue(self._outbox, final, most=1):
                return
            if not final and self._heartbeat_due():
                return  # _tick sends it; the reports go on at once after it
        self._backoff.reset()

    def _heartbeat_due(self) -> bool:
        return self._heartbeat_wanted.is_set() or time.monotonic() >= self._next_heartbeat

    def _deliver_queue(
        self, queue: collections.deque[OutboxItem], final: bool, most: int | None = None
    ) -> bool:
        """Post the queue in order (``most`` items at most); False at the first failure (the
        rest waits for a retry)."""
        posted = 0
        while queue and (most is None or posted < most):
            posted += 1
            item = queue[0]
            try:
                body = item.encoded()
            except Exception:  # a body that cannot be built must not block the items behind
                logger.exception("brakeline: could not build %s; dropped", item.key)
                queue.popleft()
                continue
            outcome = self._post(item.path, body)
            failing = self._failing_for_good(item, outcome)
            if _settled(outcome) or failing:
                self._done_with(queue, item, outcome)
                continue
            if final:
                logger.warning(
                    "brakeline: %d acknowledgements/snapshots not delivered",
                    len(self._urgent) + len(self._outbox),
                )
                return False
            retry_after = outcome.retry_after if outcome is not None else None
            self._next_outbox_attempt = time.monotonic() + self._backoff.next_delay(retry_after)
            return False
        return True

    def _failing_for_good(self, item: OutboxItem, outcome: Response | None) -> bool:
        """A server error (not an outage) counted once more; True once the item had too many."""
        return (
            outcome is not None
            and outcome.status >= 500
            and outcome.status not in OUTAGE_STATUSES
            and self._count_server_error(item.key) >= MAX_SERVER_ERRORS_PER_ITEM
        )

    def _done_with(
        self, queue: collections.deque[OutboxItem], item: OutboxItem, outcome: Response | None
    ) -> None:
        """The front item leaves the queue: delivered, or refused for good (said loudly)."""
        queue.popleft()
        self._server_errors.pop(item.key, None)
        if not outcome.ok:  # type: ignore[union-attr]
            logger.error(
                "brakeline: THE CONSOLE REFUSED %s (HTTP %s); it is dropped. The console "
                "answered: %.300s",
                item.key,
                outcome.status,  # type: ignore[union-attr]
                outcome.body,  # type: ignore[union-attr]
            )
        self._mark_delivered(item.key)

    def _count_server_error(self, key: str) -> int:
        self._server_errors[key] = self._server_errors.get(key, 0) + 1
        return self._server_errors[key]

    def _mark_delivered(self, key: str) -> None:
        with self._delivery:
            self._delivered.add(key)
            self._delivery.notify_all()

    def _holds_back(self, body: dict[str, Any]) -> bool:
        """A heartbeat saying the run finished waits while an acknowledgement is queued (a
        terminate's, typically, timed out on a loaded console and waiting for its retry): said
        first, it would end the job before the ack counts. The last round says it anyway,
        after trying the acks once more."""
        return body.get("status") == FINAL_STATUS and bool(self._urgent)

    def _send_heartbeat(self, final: bool = False) -> None:
        body = self._heartbeat_body()
        if body is None:
            body, self._unsent_heartbeat = self._unsent_heartbeat, None
        if body is None:
            return  # no training progress since the last heartbeat: let the console notice
        if not final and self._holds_back(body):
            return
        response = self._post("heartbeat", encode_json(body))
        if response is not None:
            self._console_protocol = response.protocol
        if response is not None and response.ok:
            self.inbox.offer_all(response.commands)
            self._heartbeat_taken(body)

    def _heartbeat_taken(self, body: dict[str, Any]) -> None:
        # Under the lock: this thread and the metrics thread (a heartbeat that rode) count.
        with self._delivery:
            self.heartbeats_sent += 1
            self._status_delivered = body.get("status")
            self._delivery.notify_all()

    def _post(self, path: str, body: bytes) -> Response | None:
        try:
            response = self.transport.post(path, body)
        except TransportError as error:
            logger.info("brakeline: %s not delivered: %s", path, error)
            return None
        if response.status == 401 and not self._warned_auth:
            self._warned_auth = True
            logger.error("brakeline: THE CONSOLE REJECTED THE AGENT TOKEN (401) on %s", path)
        elif response.status == 409 and path == "heartbeat" and not self._warned_refused:
            # Said once, loudly: the console will not brake this run (a finished job's token
            # reused for a new run), and nothing else would tell the person who started it.
            self._warned_refused = True
            detail = response.body.get("detail") if isinstance(response.body, dict) else None
            logger.error("brakeline: THE CONSOLE REFUSED THIS RUN (409): %s", detail or "")
        return response
