"""One conversation per node: the ranks of a node reach the console through its forwarder.

Under a launcher that says which ranks share a node (torchrun's LOCAL_RANK and
LOCAL_WORLD_SIZE), the node's local rank 0 starts a :class:`~brakeline._forwarder.NodeForwarder`
on a unix socket, and every rank of the node, local rank 0 included, posts through it
(:class:`NodeTransport`) and hears the node's websocket through it (:class:`NodeSubscription`).
Everything above the transport is unchanged: each rank keeps its own sender, spool, control
loop, heartbeats, acknowledgements, command inbox, step guard and rank agreement; the console
serves each rank's part as that rank's own request. So a node of 8 ranks costs the console one
request per interval and one websocket, where it cost eight of each.

A forwarder that is not there (not started yet, its process gone, its socket refused) costs
only the saving: a rank whose request cannot be handed over posts it to the console itself at
once, and tries the forwarder again a little later; a rank whose subscription stays lost opens
its own websocket. No rank ever waits on a dead forwarder for a command, and the forwarder's
own rank, gone, falls silent on the console like any rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from brakeline._backoff import Backoff
from brakeline._commands import CommandInbox
from brakeline._forwarder import GONE, NodeForwarder, as_response
from brakeline._frames import header, receive_frame, receive_header, send_frames
from brakeline._push import PushListener
from brakeline._settings import Settings
from brakeline._transport import HttpTransport, Response, Transport, TransportError

logger = logging.getLogger("brakeline")

MODES = ("auto", "off")
# After the forwarder could not take a request, the rank posts directly this long before it
# tries the forwarder again (a forwarder starting late is found within this).
LOCAL_RETRY_SECONDS = 2.0
# A subscription lost this long (the forwarder gone) makes the rank open its own websocket.
SUBSCRIPTION_GRACE_SECONDS = 10.0


@dataclasses.dataclass(frozen=True)
class NodePlan:
    """Where the node's forwarder listens, and which ranks share the node."""

    socket_path: str
    local_rank: int
    node_ranks: tuple[int, ...]


def node_plan(settings: Settings, environ: Mapping[str, str]) -> NodePlan | None:
    """The node's plan, or None: forwarding off, no console, or one rank on this node."""
    if settings.node_forwarding not in MODES:
        raise ValueError(f"node_forwarding must be one of {', '.join(MODES)}")
    local_rank = environ.get("LOCAL_RANK", "")
    local_size = environ.get("LOCAL_WORLD_SIZE", "")
    if settings.node_forwarding == "off" or not settings.enabled:
        return None
    if not (local_rank.isdigit() and local_size.isdigit()):
        return None
    rank, size = int(local_rank), int(local_size)
    first = settings.rank - rank
    if size < 2 or rank >= size or first < 0:
        return None
    # One name per node of one run: the same for every rank of the node, different for two
    # launchers on one machine (their first ranks differ) and for two jobs.
    identity = "\0".join(
        (
            settings.url,
            settings.token,
            settings.job,
            environ.get("TORCHELASTIC_RUN_ID", ""),
            socket.gethostname(),
            str(first),
            str(size),
        )
    )
    name = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:24]
    return NodePlan(
        str(_node_directory(settings) / f"{name}.sock"), rank, tuple(range(first, first + size))
    )


def _node_directory(settings: Settings) -> Path:
    """Only this user may reach the node's socket: it speaks for the job's token."""
    directory = Path(settings.node_dir or Path(tempfile.gettempdir()) / f"brakeline-{os.getuid()}")
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory


def bundled(path: str) -> bool:
    """A request a bundle carries (docs/protocol.md "Bundles")."""
    return path in ("metrics", "heartbeat") or (
        path.startswith("commands/") and path.endswith("/ack")
    )


class NodeTransport:
    """A rank's transport: its requests through the node's forwarder, or, when that cannot
    take one, straight to the console (the same answer either way)."""

    def __init__(self, socket_path: str, rank: int, direct: HttpTransport, window: float) -> None:
        self.socket_path = socket_path
        self.rank = rank
        self.direct = direct
        # The forwarder may wait a window, then post the bundle (and then its parts one by one).
        self.timeout = 2 * direct.timeout + window + 1.0
        # What the rank sent: through the forwarder; what the forwarder could not take (sent
        # directly); and what never goes through it (snapshots and checkpoints).
        self.through_node = 0
        self.direct_posts = 0
        self.own_posts = 0
        self._local_again_at = 0.0
        self._warned = False

    def post(self, path: str, body: bytes) -> Response:
        # Snapshots and checkpoints are rare and large: they go on their own, as before.
        if not bundled(path):
            self.own_posts += 1
            return self.direct.post(path, body)
        if time.monotonic() >= self._local_again_at:
            try:
                response = self._post_local(path, body)
            except OSError as error:  # the forwarder, not the console: go direct now
                self._local_again_at = time.monotonic() + LOCAL_RETRY_SECONDS
                self._note_direct(error)
            else:
                self.through_node += 1
                return response
        self.direct_posts += 1
        return self.direct.post(path, body)

    def _post_local(self, path: str, body: bytes) -> Response:
        urgent = path.startswith("commands/") or (
            path == "heartbeat" and b'"status":"running"' not in body
        )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(self.timeout)
            connection.connect(self.socket_path)
            send_frames(
                connection, header(op="post", path=path, rank=self.rank, urgent=urgent), body
            )
            answer = receive_header(connection)
            payload = receive_frame(connection)
        if answer.get("status") == GONE:
            raise OSError("the node's forwarder stopped")
        if not answer.get("status"):
            raise TransportError("the node's forwarder did not reach the console")
        self._warned = False
        return as_response(answer, payload)

    def _note_direct(self, error: OSError) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "brakeline: the node's forwarder is not reachable (%s); rank %d talks to the "
                "console directly until it is",
                error,
                self.rank,
            )


class NodeSubscription:
    """A rank's end of the node's websocket: commands the forwarder pushes to this rank."""

    def __init__(
        self, socket_path: str, rank: int, inbox: CommandInbox, fallback: Callable[[], Any]
    ) -> None:
        self.socket_path = socket_path
        self.rank = rank
        self.inbox = inbox
        self.connected = threading.Event()
        self._fallback = fallback
        self._direct: Any = None
        self._connection: socket.socket | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="brakeline-node-push", daemon=True)

    def start(self) -> bool:
        self._thread.start()
        return True

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        if self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection.close()
        if self._direct is not None:
            self._direct.stop(timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        backoff = Backoff(0.1, 2.0)
        lost_since = time.monotonic()
        while not self._stopping.is_set():
            try:
                self._listen()
            except (OSError, ValueError):  # gone, or a frame that is not JSON
                if self.connected.is_set():  # it was listening: lost just now
                    self.connected.clear()
                    lost_since = time.monotonic()
                    backoff.reset()
                elif time.monotonic() - lost_since >= SUBSCRIPTION_GRACE_SECONDS:
                    logger.warning(
                        "brakeline: the node's websocket is gone; rank %d opens its own", self.rank
                    )
                    self._direct = self._fallback()
                    self._direct.start()
                    return
            self._stopping.wait(backoff.next_delay())

    def _listen(self) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(self.socket_path)
            self._connection = connection
            send_frames(connection, header(op="subscribe", rank=self.rank))
            self.connected.set()
            while not self._stopping.is_set():
                command = json.loads(receive_frame(connection))
                if isinstance(command, dict):
                    self.inbox.offer(command)


class NodeLink:
    """What a rank of a forwarded node holds: its transport, its subscription, and on local
    rank 0 the forwarder with the node's websocket. Started and stopped as a push listener."""

    def __init__(
        self,
        settings: Settings,
        plan: NodePlan,
        inbox: CommandInbox,
        push: Callable[..., PushListener],
    ) -> None:
        direct = HttpTransport(settings.url, settings.token, settings.http_timeout)
        window = settings.node_window or settings.flush_interval
        self.forwarder: NodeForwarder | None = None
        self.node_push: PushListener | None = None
        if plan.local_rank == 0:
            self.forwarder = NodeForwarder(direct, plan.socket_path, len(plan.node_ranks), window)
            if self.forwarder.start() and settings.use_websocket:
                self.node_push = push(ranks=list(plan.node_ranks), deliver=self.forwarder.deliver)
        self.transport = NodeTransport(plan.socket_path, settings.rank, direct, window)
        self.subscription = (
            NodeSubscription(
                plan.socket_path, settings.rank, inbox, lambda: push(rank=settings.rank)
            )
            if settings.use_websocket
            else None
        )

    def start(self) -> bool:
        if self.node_push is not None:
            self.node_push.start()
        if self.subscription is not None:
            self.subscription.start()
        return True

    def stop(self, timeout: float = 2.0) -> None:
        if self.subscription is not None:
            self.subscription.stop(timeout)
        if self.node_push is not None:
            self.node_push.stop(timeout)
        if self.forwarder is not None:
            self.forwarder.stop()


def console_links(
    settings: Settings, inbox: CommandInbox, rank_named: bool, transport: Transport | None
) -> tuple[Transport | None, PushListener | NodeLink | None]:
    """A run's transport and push channel: through the node's forwarder where its launcher
    says the node has several ranks (and no transport was given), else its own HTTP and
    websocket conversation. ``rank_named``: the websocket names this rank (multi-rank)."""

    def push(**fields: Any) -> PushListener:
        # The run's backoff cap, not a fixed minute: after a console restart the push
        # channel is back as soon as metrics and heartbeats are.
        backoff = Backoff(settings.backoff_base, settings.backoff_cap)
        return PushListener(
            settings.websocket_url,
            settings.token,
            inbox,
            open_timeout=settings.http_timeout,
            backoff=backoff,
            **fields,
        )

    plan = node_plan(settings, os.environ) if transport is None else None
    if plan is not None:
        link = NodeLink(settings, plan, inbox, push)
        return link.transport, link
    if transport is None and settings.enabled:
        transport = HttpTransport(settings.url, settings.token, settings.http_timeout)
    listener: PushListener | None = None
    if settings.use_websocket and settings.enabled:
        listener = push(rank=settings.rank if rank_named else None)
    return transport, listener
