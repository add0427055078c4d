"""The websocket push channel: commands arrive the moment the console issues them.

Optional: without the ``websockets`` package (or when the console refuses the socket), commands
still arrive in heartbeat and metrics replies. The listener only ever feeds the inbox; it never
applies a command itself.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

from brakeline._backoff import Backoff
from brakeline._commands import CommandInbox

logger = logging.getLogger("brakeline")

RECEIVE_TIMEOUT = 1.0


class PushListener:
    """Keeps one websocket open to ``/ws/agent/`` and reconnects with backoff."""

    def __init__(
        self,
        ws_url: str,
        token: str,
        inbox: CommandInbox,
        open_timeout: float = 10.0,
        backoff: Backoff | None = None,
        rank: int | None = None,
        ranks: list[int] | None = None,
        deliver: Callable[[dict[str, Any], list[int] | None], None] | None = None,
    ) -> None:
        # A rank of a multi-rank job names itself: the console's catch-up on (re)connect then
        # leaves out the commands this rank acknowledged already (docs/protocol.md). A node's
        # forwarder names its node's ranks instead, and ``deliver`` hands each command to the
        # ranks the console names (None: every rank of the node).
        fields = {"token": token} | ({"rank": str(rank)} if rank is not None else {})
        if ranks:
            fields["ranks"] = ",".join(str(one) for one in ranks)
        self._deliver = deliver or (lambda command, _ranks: self.inbox.offer(command))
        query = urllib.parse.urlencode(fields)
        self.url = f"{ws_url}{'&' if '?' in ws_url else '?'}{query}"
        self.token = token
        self.inbox = inbox
        self.open_timeout = open_timeout
        self.connected = threading.Event()
        self.messages_received = 0
        self._backoff = backoff or Backoff(base=1.0, cap=60.0)
        self._stopping = threading.Event()
        self._connection: Any = None
        self._thread = threading.Thread(target=self._run, name="brakeline-push", daemon=True)

    def start(self) -> bool:
        """Start listening; False when the websockets package is missing (heartbeat fallback)."""
        try:
            import websockets.sync.client  # noqa: F401 - lazily, the SDK works without it
        except ImportError:
            logger.info("brakeline: 'websockets' not installed; commands arrive by heartbeat")
            return False
        self._thread.start()
        return True

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        connection = self._connection
        if connection is not None:
            # Closing a dead socket may fail; we are leaving anyway.
            with contextlib.suppress(Exception):
                connection.close()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _connect_options(self, connect: Any) -> dict[str, Any]:
        options: dict[str, Any] = {
            "additional_headers": {"Authorization": f"Bearer {self.token}"},
            "open_timeout": self.open_timeout,
        }
        if "proxy" in inspect.signature(connect).parameters:
            options["proxy"] = None  # websockets >= 15 would otherwise use the env's proxy
        return options

    def _run(self) -> None:
        from websockets.sync.client import connect

        options = self._connect_options(connect)
        while not self._stopping.is_set():
            try:
                with connect(self.url, **options) as connection:
                    self._connection = connection
                    self.connected.set()
                    self._backoff.reset()
                    self._receive(connection)
            except Exception as error:  # any failure means "reconnect later"
                if not self._stopping.is_set():
                    logger.info("brakeline: push channel down (%s); heartbeat fallback", error)
            finally:
                self._connection = None
                self.connected.clear()
            self._stopping.wait(self._backoff.next_delay())

    def _receive(self, connection: Any) -> None:
        while not self._stopping.is_set():
            try:
                message = connection.recv(timeout=RECEIVE_TIMEOUT)
            except TimeoutError:
                continue
            self.messages_received += 1
            self._handle(message)

    def _handle(self, message: str | bytes) -> None:
        try:
            payload = json.loads(message)
        except ValueError:
            logger.info("brakeline: ignoring a push message that is not JSON")
            return
        if isinstance(payload, dict) and payload.get("type") == "command":
            command = payload.get("command")
            ranks = payload.get("ranks")
            if isinstance(command, dict):
                self._deliver(command, ranks if isinstance(ranks, list) else None)
