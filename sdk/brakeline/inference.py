"""Inference mode: a replica behind a load balancer heartbeats on its own, with its health.

    replica = brakeline.inference.Replica("r1", backend="models", health=watch.health)
    replica.start()
    ...
    # in the server's own health endpoint (or use replica.health_response()):
    status, body = replica.health_response()

Each replica of an inference job heartbeats to ``POST /api/v1/agent/replicas/heartbeat``
with its name (the load balancer's server name), backend, process and health. The health hook
is yours (``health() -> (healthy, detail)``); :class:`OutputWatch` is a ready one that turns
unhealthy when recent outputs hold NaN/Inf or errors. A change of health is reported at once
(``poke``), not at the next interval: the console's L3 response (drain it in the load
balancer, restart it, put it back when healthy) starts from that heartbeat.

Commands in the heartbeat reply, for when the console cannot act from outside:
``drain`` (report unhealthy to the load balancer's checks and call ``on_drain``) and
``restart`` (``on_restart``, by default: start this same command line again once this process
has exited, then exit).

Stdlib only, like the rest of the SDK. Never raises into the server: a failed heartbeat is
logged and retried at the next interval.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from brakeline._settings import resolve_settings
from brakeline._transport import HttpTransport, Transport, TransportError, encode_json

logger = logging.getLogger("brakeline.inference")
HEALTH_PATH = "replicas/heartbeat"
# Started by the default restart: waits for the old process to exit (the port it listens on
# is free then), then becomes the same command line.
_RELAUNCH = (
    "import os, sys, time\n"
    "pid = int(sys.argv[1])\n"
    "def gone():\n"
    "    try:\n"
    "        os.kill(pid, 0)\n"
    "    except ProcessLookupError:\n"
    "        return True\n"
    # An exited process its parent has not reaped yet is a zombie: gone, its port is free.
    "    try:\n"
    "        with open(f'/proc/{pid}/stat') as stat:\n"
    "            return stat.read().rsplit(')', 1)[1].split()[0] in ('Z', 'X')\n"
    "    except OSError:\n"
    "        return False\n"
    "deadline = time.monotonic() + 60\n"
    "while time.monotonic() < deadline and not gone():\n"
    "    time.sleep(0.05)\n"
    "os.execv(sys.argv[2], sys.argv[3:])\n"
)

Health = Callable[[], "tuple[bool, str]"]


class OutputWatch:
    """A health hook over the last ``window`` responses: unhealthy when more than
    ``max_bad`` of them held a non-finite number or were errors."""

    def __init__(self, window: int = 20, max_bad: int = 0) -> None:
        self._recent: collections.deque[str] = collections.deque(maxlen=window)
        self._lock = threading.Lock()
        self.max_bad = max_bad
        self.on_change: Callable[[], Any] | None = None

    def observe(self, values: Iterable[float] | float) -> bool:
        """Record one response's outputs; True when all were finite."""
        numbers = [values] if isinstance(values, (int, float)) else list(values)
        finite = all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers)
        self._record("ok" if finite else "nonfinite")
        return finite

    def error(self) -> None:
        """Record a failed response (an exception in the model)."""
        self._record("error")

    def _record(self, outcome: str) -> None:
        with self._lock:
            before = self._healthy_locked()
            self._recent.append(outcome)
            changed = before != self._healthy_locked()
        if changed and self.on_change is not None:
            self.on_change()

    def _healthy_locked(self) -> bool:
        return sum(1 for outcome in self._recent if outcome != "ok") <= self.max_bad

    def health(self) -> tuple[bool, str]:
        with self._lock:
            counts = collections.Counter(self._recent)
            healthy = self._healthy_locked()
        if healthy:
            return True, ""
        parts = [
            f"{counts[kind]} {word}"
            for kind, word in (("nonfinite", "NaN/Inf outputs"), ("error", "errors"))
            if counts[kind]
        ]
        return False, f"{' and '.join(parts)} in the last {len(self._recent)} responses"


def _default_restart() -> None:
    """Start this command line again once this process has gone, and leave."""
    import subprocess

    subprocess.Popen(
        [sys.executable, "-c", _RELAUNCH, str(os.getpid()), sys.executable, *sys.orig_argv],
        start_new_session=True,
    )
    os._exit(0)


class Replica:
    """One replica's heartbeat thread, health and commands."""

    def __init__(
        self,
        name: str,
        *,
        backend: str,
        health: Health | None = None,
        url: str | None = None,
        token: str | None = None,
        interval: float = 1.0,
        on_drain: Callable[[], Any] | None = None,
        on_restart: Callable[[], Any] | None = None,
        transport: Transport | None = None,
    ) -> None:
        settings = resolve_settings({"url": url, "token": token})
        self.name, self.backend = name, backend
        self.interval = interval
        self._health = health or (lambda: (True, ""))
        self._on_drain, self._on_restart = on_drain, on_restart or _default_restart
        self.transport = transport
        if transport is None and settings.enabled:
            self.transport = HttpTransport(settings.url, settings.token, settings.http_timeout)
        self.draining = False
        self.status = "unknown"  # as the console last said: serving, draining, restarting…
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="brakeline-replica", daemon=True)
        self.hostname = socket.gethostname()

    def start(self) -> Replica:
        if self.transport is None:
            logger.warning("brakeline: no console configured; replica %s runs offline", self.name)
            return self
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def poke(self) -> None:
        """Heartbeat now (the health changed)."""
        self._wake.set()

    def health(self) -> tuple[bool, str]:
        try:
            healthy, detail = self._health()
        except Exception as error:  # a broken hook is an unhealthy replica, not a dead thread
            return False, f"health hook failed: {type(error).__name__}: {error}"
        if self.draining:
            return False, "draining"
        return bool(healthy), str(detail)[:500]

    def health_response(self) -> tuple[int, dict[str, Any]]:
        """(status, body) for the server's health endpoint: 503 while unhealthy or draining,
        so the load balancer's own checks agree with the console."""
        healthy, detail = self.health()
        return (200 if healthy else 503), {
            "healthy": healthy,
            "detail": detail,
            "replica": self.name,
        }

    def heartbeat(self) -> list[dict[str, Any]]:
        """Send one heartbeat; the commands of the reply (also applied)."""
        healthy, detail = self.health()
        body = {
            "replica": self.name,
            "backend": self.backend,
            "pid": os.getpid(),
            "hostname": self.hostname,
            "healthy": healthy,
            "detail": detail,
            "draining": self.draining,
        }
        assert self.transport is not None
        answer = self.transport.post(HEALTH_PATH, encode_json(body))
        if not answer.ok:
            logger.warning(
                "brakeline: replica heartbeat refused (%s): %s", answer.status, answer.body
            )
            return []
        self.status = str(answer.body.get("status", self.status))
        commands = answer.commands
        for command in commands:
            self._apply(command)
        return commands

    def _apply(self, command: dict[str, Any]) -> None:
        action = command.get("action")
        logger.warning("brakeline: replica %s: console asks to %s", self.name, action)
        if action == "drain" and not self.draining:
            self.draining = True
            if self._on_drain is not None:
                self._on_drain()
        elif action == "restart":
            self._on_restart()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.heartbeat()
            except TransportError as error:
                logger.warning("brakeline: replica heartbeat failed: %s", error)
            except Exception:  # the thread must keep heartbeating whatever happens
                logger.exception("brakeline: replica heartbeat failed")
            self._wake.wait(self.interval)
            self._wake.clear()
