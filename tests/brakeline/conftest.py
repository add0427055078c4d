"""Fixtures for the SDK tests. The unit tests need no console: a RecordingTransport stands in
for the network at the SDK's own transport seam. The integration tests (test_integration_live_*)
use the real console instead: ``training`` starts training subprocesses, ``restartable_console``
is a Daphne that a test may stop and start again on the same port (helpers in ``live.py``)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import brakeline
from brakeline._transport import Response, TransportError
from tests.brakeline.live import RestartableConsole, TrainingLauncher
from tests.conftest import free_port


class RecordingTransport:
    """Answers every POST from a script and records it. Thread-safe: the SDK's background
    threads call it concurrently.

    ``responder(path, body) -> Response | None`` decides answers (None: the default answer);
    ``down = True`` makes every call fail like an unreachable console.
    """

    timeout = 1.0

    def __init__(self) -> None:
        self.calls: list[tuple[float, str, dict[str, Any]]] = []
        self.down = False
        self.responder: Callable[[str, dict[str, Any]], Response | None] | None = None
        self._lock = threading.Lock()
        self.commands: list[dict[str, Any]] = []  # returned in every reply, like the console

    def post(self, path: str, body: bytes) -> Response:
        decoded = json.loads(body)
        with self._lock:
            self.calls.append((time.monotonic(), path, decoded))
        if self.down:
            raise TransportError("connection refused (test)")
        if self.responder is not None:
            answer = self.responder(path, decoded)
            if answer is not None:
                return answer
        return self.default_answer(path, decoded)

    def default_answer(self, path: str, body: dict[str, Any]) -> Response:
        if path == "metrics":
            return Response(202, {"accepted": len(body["points"]), "commands": self.commands})
        if path == "heartbeat":
            return Response(200, {"commands": self.commands})
        if path == "snapshots":
            return Response(201, {"id": 1})
        return Response(200, {})

    def bodies(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [body for _, called, body in self.calls if called == path]

    def points(self) -> list[dict[str, Any]]:
        """Points of every metrics POST (accepted or not), in order."""
        return [point for body in self.bodies("metrics") for point in body["points"]]


def wait_until(condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.01) -> Any:
    """Poll until ``condition`` holds; the deadline is generous (a loaded machine), not a goal."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


class ExitRecorder:
    """An injectable exit function that records the code instead of leaving the process."""

    def __init__(self) -> None:
        self.codes: list[int] = []

    def __call__(self, code: int) -> None:
        self.codes.append(code)


@pytest.fixture
def transport() -> RecordingTransport:
    return RecordingTransport()


@pytest.fixture
def exits() -> ExitRecorder:
    return ExitRecorder()


@pytest.fixture
def make_run(tmp_path, transport, exits) -> Iterator[Callable[..., brakeline.Run]]:
    """Build runs wired to the recording transport, with test-sized intervals."""
    runs: list[brakeline.Run] = []

    def build(**overrides: Any) -> brakeline.Run:
        options: dict[str, Any] = {
            "job": "test-job",
            "url": "http://console.invalid",
            "token": "test-token",
            "transport": transport,
            "exit_function": exits,
            "use_websocket": False,
            "send_snapshots": False,  # tests of snapshots turn them on
            "spill_dir": str(tmp_path / "spill"),
            "checkpoint_dir": str(tmp_path / "checkpoints"),
            "flush_interval": 0.05,
            "heartbeat_interval": 0.05,
            "backoff_base": 0.01,
            "backoff_cap": 0.05,
            "finish_timeout": 2.0,
            "ack_wait_before_release": 1.0,
        }
        options.update(overrides)
        run = brakeline.init(**options)
        runs.append(run)
        return run

    yield build
    for run in runs:
        run.finish(timeout=1.0)


@pytest.fixture
def training(tmp_path) -> Iterator[TrainingLauncher]:
    """Start training scripts (tests/brakeline/scripts) as subprocesses; killed at the end."""
    launcher = TrainingLauncher(tmp_path)
    yield launcher
    launcher.stop_all()


@pytest.fixture
def restartable_console(transactional_db) -> Iterator[RestartableConsole]:
    """Daphne on a free port chosen once, against the test database; the test may stop() and
    start() it again on the same port."""
    console = RestartableConsole(free_port())
    console.start()
    yield console
    console.stop()
