"""The node's forwarder: one conversation with the console for every rank of a node.

It runs as threads of the node's local rank 0 and listens on a unix socket only the user can
reach (``brakeline._node`` decides where). Each rank's transport hands it the requests the rank
would have posted itself (metrics batches, heartbeats, acknowledgements); the forwarder waits
until every rank of the node has one waiting, or ``window`` seconds after the first, or
``URGENT_WAIT`` after an urgent one (an acknowledgement, a heartbeat announcing a hold), and
posts them as one bundle (``POST /api/v1/agent/bundle``, docs/protocol.md "Bundles"). Each
rank gets its own part's answer, exactly what the console would have said to its own request;
its sender and control loop retry, spool and back off as they always do. A console without
bundles (an older one: 404), a bundle over its size limit (413) or refused whole (400) is sent
part by part.

It also holds the node's one websocket and hands each pushed command to the node's ranks that
subscribed (the console's catch-up names the ranks that still need a command).

Threads: an accept thread, a thread per waiting request (a rank has at most a few in flight),
the bundling thread and the push listener; the waiting parts are guarded by one Condition.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from typing import Any

from brakeline._frames import FrameError, header, receive_frame, receive_header, send_frames
from brakeline._transport import Response, Transport, TransportError

logger = logging.getLogger("brakeline")

# An urgent part (an acknowledgement, a hold) waits this long for its node's other ranks: they
# hold, and acknowledge, within milliseconds of each other (their collectives keep them in step).
URGENT_WAIT = 0.05
# The status a waiting part is answered with when the forwarder stops: "post it yourself".
GONE = -1
# Answers after which the parts are sent on their own: a console that has no bundles (404, 405),
# one whose size limit the bundle passed (413) or that refused the bundle's shape (400).
ONE_BY_ONE_STATUSES = {400, 404, 405, 413}


class Part:
    """One rank's request waiting in the forwarder, and then its answer."""

    def __init__(self, path: str, body: bytes, rank: int, urgent: bool) -> None:
        self.path, self.body, self.rank, self.urgent = path, body, rank, urgent
        self.arrived = time.monotonic()
        self.answer: tuple[int, bytes, float | None, int] = (0, b"{}", None, 0)
        self.done = threading.Event()

    def settle(self, status: int, body: bytes, retry_after: float | None, protocol: int) -> None:
        self.answer = (status, body, retry_after, protocol)
        self.done.set()


class NodeForwarder:
    """Bundles the node's ranks' requests and fans the node's websocket out to them."""

    def __init__(self, transport: Transport, path: str, local_ranks: int, window: float) -> None:
        self.transport = transport
        self.path = path
        self.local_ranks = local_ranks
        self.window = window
        self.bundles_sent = 0
        self.parts_sent = 0
        self._waiting: list[Part] = []
        self._changed = threading.Condition()
        self._subscribers: dict[int, list[socket.socket]] = {}
        self._subscribers_lock = threading.Lock()
        self._bundles = True  # False once the console said it has none (404)
        self._stopping = threading.Event()
        self._server: socket.socket | None = None

    def start(self) -> bool:
        """Listen on the node's socket; False (the ranks then talk to the console directly)
        when it cannot be made."""
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # a previous run's, whose forwarder is gone
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(self.path)
            server.listen(256)
        except OSError as error:
            logger.warning("brakeline: no node forwarder at %s (%s)", self.path, error)
            return False
        self._server = server
        for target, name in ((self._accept, "accept"), (self._bundle_loop, "bundle")):
            threading.Thread(target=target, name=f"brakeline-node-{name}", daemon=True).start()
        return True

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            waiting, self._waiting = self._waiting, []
            self._changed.notify_all()
        for part in waiting:  # their ranks post them directly, now
            part.settle(GONE, b"{}", None, 0)
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with self._subscribers_lock:
            for connections in self._subscribers.values():
                for connection in connections:
                    with contextlib.suppress(OSError):
                        connection.close()
            self._subscribers.clear()

    # -- the node's websocket ----------------------------------------------------------------------
    def deliver(self, command: dict[str, Any], ranks: list[int] | None) -> None:
        """A pushed command to the subscribed ranks (``ranks``: only those; None: all)."""
        frame = json.dumps(command, separators=(",", ":")).encode("utf-8")
        with self._subscribers_lock:
            for rank, connections in self._subscribers.items():
                if ranks is not None and rank not in ranks:
                    continue
                for connection in list(connections):
                    try:
                        send_frames(connection, frame)
                    except OSError:  # that rank went away: it resubscribes when it can
                        connections.remove(connection)

    # -- the local socket --------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self._server is not None
        while not self._stopping.is_set():
            try:
                connection, _ = self._server.accept()
            except OSError:
                return  # closed by stop()
            threading.Thread(
                target=self._serve, args=(connection,), name="brakeline-node-part", daemon=True
            ).start()

    def _serve(self, connection: socket.socket) -> None:
        try:
            request = receive_header(connection)
            rank = request.get("rank")
            if not isinstance(rank, int):
                raise FrameError("a request without its rank")
            if request.get("op") == "subscribe":
                with self._subscribers_lock:
                    if not self._stopping.is_set():  # stop() closes what it finds here
                        self._subscribers.setdefault(rank, []).append(connection)
                        return  # kept open: deliver() writes to it
                raise FrameError("the forwarder is stopping")
            part = Part(
                str(request.get("path")),
                receive_frame(connection),
                rank,
                bool(request.get("urgent")),
            )
            self._enqueue(part)
            part.done.wait()
            status, body, retry_after, protocol = part.answer
            send_frames(
                connection, header(status=status, retry_after=retry_after, protocol=protocol), body
            )
        except OSError as error:
            logger.debug("brakeline: node socket request dropped (%s)", error)
        connection.close()

    def _enqueue(self, part: Part) -> None:
        with self._changed:
            self._waiting.append(part)
            self._changed.notify_all()

    # -- the bundling thread -----------------------------------------------------------------------
    def _bundle_loop(self) -> None:
        while not self._stopping.is_set():
            parts = self._next_bundle()
            if not parts:
                continue
            try:
                self._send(parts)
            except Exception:  # a bug here must answer the ranks, never leave them waiting
                logger.exception("brakeline: node forwarder error (the parts go on their own)")
            for part in parts:
                if not part.done.is_set():
                    part.settle(0, b"{}", None, 0)

    def _next_bundle(self) -> list[Part]:
        """Wait for the parts of the next bundle: every rank has one, or the oldest has waited
        ``window`` seconds, or the oldest urgent one ``URGENT_WAIT``."""
        with self._changed:
            while not self._stopping.is_set():
                if self._waiting:
                    ranks = {part.rank for part in self._waiting}
                    left = self._waiting[0].arrived + self.window - time.monotonic()
                    urgent = [part.arrived for part in self._waiting if part.urgent]
                    if urgent:
                        left = min(left, urgent[0] + URGENT_WAIT - time.monotonic())
                    if len(ranks) >= self.local_ranks or left <= 0:
                        parts, self._waiting = self._waiting, []
                        return parts
                    self._changed.wait(left)
                else:
                    self._changed.wait(1.0)
        return []

    def _send(self, parts: list[Part]) -> None:
        if not self._bundles or len(parts) == 1:
            self._one_by_one(parts)
            return
        body = {"parts": [{"path": p.path, "body": p.body.decode("utf-8")} for p in parts]}
        try:
            response = self.transport.post("bundle", json.dumps(body).encode("utf-8"))
        except TransportError:
            return  # every part settles as "not reached": each rank retries as it would
        self.bundles_sent += 1
        self.parts_sent += len(parts)
        results = response.body.get("results") if response.ok else None
        if isinstance(results, list) and len(results) == len(parts):
            for part, result in zip(parts, results, strict=True):
                _settle_from_result(part, result, response.protocol)
            return
        if response.status in ONE_BY_ONE_STATUSES:
            if response.status in (404, 405):
                self._bundles = False
                logger.info(
                    "brakeline: the console takes no bundles; the node's parts go one by one"
                )
            self._one_by_one(parts)
            return
        for part in parts:  # 401, 429, 5xx: the same answer for every part, retried alike
            part.settle(
                response.status, _encode(response.body), response.retry_after, response.protocol
            )

    def _one_by_one(self, parts: list[Part]) -> None:
        for part in parts:
            try:
                response = self.transport.post(part.path, part.body)
            except TransportError:
                part.settle(0, b"{}", None, 0)
                continue
            part.settle(
                response.status, _encode(response.body), response.retry_after, response.protocol
            )


def _settle_from_result(part: Part, result: Any, protocol: int) -> None:
    status = result.get("status") if isinstance(result, dict) else None
    body = result.get("body") if isinstance(result, dict) else None
    if isinstance(status, int) and isinstance(body, dict):
        part.settle(status, _encode(body), None, protocol)
    else:
        part.settle(0, b"{}", None, protocol)  # not an answer: the rank retries the part


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def as_response(answer: dict[str, Any], body: bytes) -> Response:
    """A rank's part answer as the Response its own request would have had."""
    try:
        decoded = json.loads(body) if body else {}
    except ValueError:
        decoded = {}
    retry_after = answer.get("retry_after")
    protocol = answer.get("protocol")
    return Response(
        status=int(answer.get("status") or 0),
        body=decoded if isinstance(decoded, dict) else {"value": decoded},
        retry_after=float(retry_after) if isinstance(retry_after, int | float) else None,
        protocol=protocol if isinstance(protocol, int) else 0,
    )
