"""The background thread that turns ``run.log`` calls into metrics batches for the console.

Thread-safety: the training thread only calls :meth:`MetricsSender.submit` (a deque append, which
is atomic in CPython, plus an Event poke). Everything else - encoding, the spool, the HTTP calls,
backoff - belongs to the sender thread alone, so it needs no locks. ``flush`` and ``stop`` talk to
the thread through Events and a Condition.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from brakeline._backoff import Backoff
from brakeline._encoding import LogRecord, RecordExpander
from brakeline._spool import Batch, PointSpool
from brakeline._transport import Response, Transport, TransportError, encode_json

logger = logging.getLogger("brakeline")

# A 4xx says this batch will never be accepted: it is dropped (logged as an error with the
# console's answer, and counted) so it cannot hold back the batches after it. Except these,
# which say "not now" rather than "never": 401 (the token: every batch would fail alike, and
# fixing the token delivers them), 408 (timeout), 429 (rate limit). 413 halves the batches.
RETRIED_CLIENT_ERRORS = {401, 408, 429}
# A console that answers 500 to the same batch this many times in a row is failing on that
# batch (a 502/503/504 is an outage, retried without limit): it is dropped like a 4xx.
MAX_SERVER_ERRORS_PER_BATCH = 5
OUTAGE_STATUSES = {502, 503, 504}


def _refuses_heartbeat(response: Response) -> bool:
    """The console refused the riding heartbeat, not the batch's points: a 400 naming the
    heartbeat's fields, or a 409 (it refuses this run's heartbeats: a finished job's token
    reused; the control loop's own heartbeat then says so loudly)."""
    fields = response.body.get("fields") if isinstance(response.body, dict) else None
    named = isinstance(fields, dict) and any(
        str(key).split(".")[0] == "heartbeat" for key in fields
    )
    return (response.status == 400 and named) or response.status == 409


def refused_for_good(status: int) -> bool:
    """A 4xx answer that retrying cannot change (see RETRIED_CLIENT_ERRORS)."""
    return 400 <= status < 500 and status not in RETRIED_CLIENT_ERRORS


class HeartbeatRider(Protocol):
    """Where a due heartbeat comes from, and is told how its ride went (the control loop)."""

    def ride(self, within: float) -> dict[str, Any] | None: ...

    def rode(self, heartbeat: dict[str, Any], response: Response | None) -> None: ...


# Wake the thread early once this many log records wait, so big bursts are batched by size.
WAKE_AFTER_RECORDS = 64


class MetricsSender:
    """Batches, sends, retries and spills metric points in its own daemon thread."""

    def __init__(
        self,
        transport: Transport | None,
        spool: PointSpool,
        node: str,
        on_commands: Callable[[list[dict[str, Any]]], object],
        flush_interval: float = 1.0,
        max_queue_records: int = 100_000,
        backoff: Backoff | None = None,
        max_retry_after: float = 300.0,
    ) -> None:
        self.transport = transport
        self.spool = spool
        self.flush_interval = flush_interval
        self.max_queue_records = max_queue_records
        self.queue_dropped = 0
        self.sent_points = 0
        self._max_retry_after = max_retry_after
        self._queue: collections.deque[LogRecord] = collections.deque()
        self._expander = RecordExpander(node)
        self._on_commands = on_commands
        self._backoff = backoff or Backoff()
        self._configured_batch_points = spool.batch_points
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flush_wanted = threading.Event()
        self._progress = threading.Condition()
        # Written by the sender thread only, under _progress, at the end of each loop: whether
        # it had nothing pending then, and how many loops it has completed. Another thread
        # cannot judge idleness from the queue and the spool itself: a record taken off the
        # queue but not yet in the spool is in neither.
        self._loops = 0
        self._idle_after_loop = True
        self._next_attempt = 0.0
        self._last_send = time.monotonic()
        self._unreachable_since: float | None = None
        self._auth_warned = False
        self.refused_batches = 0  # batches the console refused for good (4xx, repeated 500)
        self._server_errors = 0  # consecutive 5xx (not outages) answered to the head batch
        # The control loop, whose heartbeats ride in batches when both are due (ControlLoop.ride).
        self.heartbeats: HeartbeatRider | None = None
        self._heartbeat_refused = False
        self._thread = threading.Thread(target=self._run, name="brakeline-metrics", daemon=True)

    # -- called from the training thread ---------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, record: LogRecord) -> bool:
        """Queue one log call; never blocks. False (and counted) if the queue is full."""
        if len(self._queue) >= self.max_queue_records:
            self.queue_dropped += 1
            return False
        self._queue.append(record)
        if len(self._queue) >= WAKE_AFTER_RECORDS and not self._wake.is_set():
            self._wake.set()
        return True

    def flush(self, timeout: float) -> bool:
        """Try to deliver everything queued so far; True if nothing is left pending."""
        if not self._thread.is_alive():
            return self._is_idle()
        deadline = time.monotonic() + timeout
        with self._progress:
            started = self._loops
        self._flush_wanted.set()
        self._wake.set()
        with self._progress:
            # Idle as seen at the end of a loop that began after this call: everything
            # submitted before it has been drained, encoded and sent (or refused for good).
            while not (self._loops > started and self._idle_after_loop):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._progress.wait(min(remaining, 0.05))
        return True

    def stop(self, timeout: float) -> bool:
        """Deliver what can be delivered within timeout, spill the rest to disk, end the thread."""
        delivered = self.flush(timeout) if self._thread.is_alive() else self._is_idle()
        self._stopping.set()
        self._wake.set()
        # The thread spills what is left itself (it owns the spool); allow for one HTTP call.
        self._thread.join(timeout=self.transport_timeout() + 5.0)
        if self._thread.is_alive():
            logger.warning(
                "brakeline: metrics thread still busy at finish; %d log calls may be lost",
                len(self._queue),
            )
        elif self.spool.pending_points:
            logger.warning(
                "brakeline: %d metric points not delivered; kept in %s for the next start",
                self.spool.pending_points,
                self.spool.directory,
            )
        return delivered

    def transport_timeout(self) -> float:
        return float(getattr(self.transport, "timeout", 10.0))

    # -- the sender thread -----------------------------------------------------------------------
    def _is_idle(self) -> bool:
        return not self._queue and self.spool.pending_points == 0

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._wake.wait(self._seconds_to_wait())
                self._wake.clear()
                self._drain_queue()
                if self._should_send_now():
                    self._send_pending()
            except Exception:  # a bug here must never reach the training loop
                logger.exception("brakeline: metrics thread error (continuing)")
                self._schedule_retry(None)
            with self._progress:
                self._idle_after_loop = self._is_idle()
                self._loops += 1
                self._progress.notify_all()
        try:
            self._drain_queue()
            self.spool.spill_all()
        except Exception:
            logger.exception("brakeline: could not spill the last metrics at finish")

    def _seconds_to_wait(self) -> float:
        """Sleep until the next send is due; with nothing pending, until woken or an interval."""
        if self.spool.pending_points == 0 and not self._queue:
            return self.flush_interval
        now = time.monotonic()
        due = max(self._next_attempt, self._last_send + self.flush_interval)
        # A small floor: never spin, even if the clock says a send is already overdue.
        return min(max(due - now, 0.001), self.flush_interval)

    def _drain_queue(self) -> None:
        # popleft on a deque is atomic: the training thread may append concurrently.
        while self._queue:
            record = self._queue.popleft()
            try:
                self.spool.add(self._expander.expand(record))
            except Exception:  # one bad record must not stop the others
                logger.exception("brakeline: could not encode a log record (skipped)")

    def _should_send_now(self) -> bool:
        if self.transport is None or self.spool.pending_points == 0:
            return False
        now = time.monotonic()
        if self._flush_wanted.is_set():
            return True  # a flush may try once even inside a backoff window
        if now < self._next_attempt:
            return False
        return (
            self.spool.memory_points >= self.spool.batch_points
            or now - self._last_send >= self.flush_interval
            or self.spool.spilled_points > 0
        )

    def _send_pending(self) -> None:
        flushing = self._flush_wanted.is_set()
        self._flush_wanted.clear()
        self._last_send = time.monotonic()
        while not self._stopping.is_set():
            batch = self.spool.next_batch()
            if batch is None:
                return
            if not self._send_batch(batch):
                return
            if (
                not flushing
                and self.spool.memory_points < self.spool.batch_points
                and not self.spool.spilled_points
            ):
                return

    def _send_batch(self, batch: Batch) -> bool:
        """Send one batch, with the rank's heartbeat when one is due before the next batch
        (one request instead of two); True if the loop may go on with the next one."""
        riding = self.heartbeats is not None and not self._heartbeat_refused
        heartbeat = self.heartbeats.ride(self.flush_interval) if riding else None  # type: ignore[union-attr]
        body = batch.body(None if heartbeat is None else encode_json(heartbeat))
        try:
            response = self.transport.post("metrics", body)  # type: ignore[union-attr]
        except TransportError as error:
            if heartbeat is not None:
                self.heartbeats.rode(heartbeat, None)  # type: ignore[union-attr]
            self._note_unreachable(str(error))
            self._schedule_retry(None)
            return False
        if heartbeat is not None:
            self.heartbeats.rode(heartbeat, response)  # type: ignore[union-attr]
            if _refuses_heartbeat(response):
                # The console refused the heartbeat, not the points: heartbeats go on their
                # own from now on (where the console says why), the batch again without it.
                self._heartbeat_refused = True
                return True
        return self._handle_response(batch, response)

    def _handle_response(self, batch: Batch, response: Response) -> bool:
        if response.ok:
            self._server_errors = 0
            self._note_reachable()
            self.spool.commit(batch)
            self.sent_points += len(batch.lines)
            self._backoff.reset()
            # Grow back towards the configured size after a 413 made batches smaller.
            self.spool.batch_points = min(
                self._configured_batch_points, self.spool.batch_points * 2
            )
            if response.commands:
                self._on_commands(response.commands)
            return True
        if response.status == 413 and len(batch.lines) > 1:
            # The console's limit is lower than ours: halve the batches and go on at once. A
            # 413 stored nothing, so the sealed batch may be cut into new ones (new ids).
            self.spool.batch_points = max(1, len(batch.lines) // 2)
            self.spool.unseal()
            return True
        if refused_for_good(response.status):
            self._refuse(batch, response, "refused")
            return True
        if response.status >= 500 and response.status not in OUTAGE_STATUSES:
            self._server_errors += 1
            if self._server_errors >= MAX_SERVER_ERRORS_PER_BATCH:
                self._refuse(batch, response, f"failed {self._server_errors} times on")
                return True
        if response.status == 401 and not self._auth_warned:
            self._auth_warned = True
            logger.error(
                "brakeline: THE CONSOLE REJECTED THE AGENT TOKEN (401). Training goes on; metrics "
                "are kept (memory, then %s) and retried. Check BRAKELINE_TOKEN.",
                self.spool.directory,
            )
        elif response.status != 429:
            self._note_unreachable(f"HTTP {response.status} {response.body}")
        self._schedule_retry(response.retry_after)
        return False

    def _refuse(self, batch: Batch, response: Response, what: str) -> None:
        """Drop the batch the console will not take, once and loudly; the next one goes on."""
        self._server_errors = 0
        self.refused_batches += 1
        self._backoff.reset()
        self._next_attempt = 0.0
        logger.error(
            "brakeline: THE CONSOLE %s A METRICS BATCH (HTTP %s, %d points); it is dropped and "
            "the next batches go on. The console answered: %s",
            what.upper(),
            response.status,
            len(batch.lines),
            response.body,
        )
        self.spool.drop(batch, f"console answered {response.status}: {response.body}")

    def _schedule_retry(self, retry_after: float | None) -> None:
        delay = self._backoff.next_delay(retry_after, self._max_retry_after)
        self._next_attempt = time.monotonic() + delay

    def _note_unreachable(self, why: str) -> None:
        if self._unreachable_since is None:
            self._unreachable_since = time.monotonic()
            logger.warning("brakeline: console not reachable (%s); buffering metrics", why)

    def _note_reachable(self) -> None:
        if self._unreachable_since is not None:
            outage = time.monotonic() - self._unreachable_since
            self._unreachable_since = None
            logger.warning(
                "brakeline: console reachable again after %.1f s; replaying %d buffered points",
                outage,
                self.spool.pending_points,
            )
