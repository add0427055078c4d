"""The SDK's inference mode without the console: health, heartbeats, drain and restart.

The restart test runs real processes: a replica asked to restart itself starts its own
command line again once it has exited (a new pid, the same arguments)."""

import math
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brakeline._transport import Response
from brakeline.inference import OutputWatch, Replica
from tests.brakeline.conftest import RecordingTransport

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("observed", "max_bad", "healthy", "detail"),
    [
        ([1.0, 2.0], 0, True, ""),
        ([1.0, math.nan], 0, False, "1 NaN/Inf outputs in the last 2 responses"),
        (
            [1.0, math.inf, "error"],
            1,
            False,
            "1 NaN/Inf outputs and 1 errors in the last 3 responses",
        ),
        ([[1.0, math.nan]], 1, True, ""),
        ([math.nan] + [1.0] * 10, 0, True, ""),  # the NaN left the window of 10
    ],
)
def test_output_watch(observed, max_bad, healthy, detail):
    watch = OutputWatch(window=10, max_bad=max_bad)
    for value in observed:
        watch.error() if value == "error" else watch.observe(value)
    assert watch.health() == (healthy, detail)


def test_a_change_of_health_is_reported_at_once():
    changes = []
    watch = OutputWatch(window=5)
    watch.on_change = lambda: changes.append(watch.health()[0])
    watch.observe(1.0)
    watch.observe(math.nan)
    watch.observe(math.nan)  # still unhealthy: no second report
    assert changes == [False]


def test_heartbeat_body_and_the_drain_command():
    transport = RecordingTransport()
    drained = []
    replica = Replica(
        "r1", backend="models", transport=transport, on_drain=lambda: drained.append(1)
    )
    transport.responder = lambda path, body: Response(
        200, {"replica": "r1", "status": "draining", "commands": [{"action": "drain"}]}
    )
    assert replica.heartbeat() == [{"action": "drain"}]
    body = transport.bodies("replicas/heartbeat")[0]
    assert body["replica"] == "r1" and body["backend"] == "models" and body["healthy"] is True
    assert replica.draining and drained == [1] and replica.status == "draining"
    # Draining: the server's own health endpoint says 503, so the load balancer agrees.
    assert replica.health_response() == (
        503,
        {"healthy": False, "detail": "draining", "replica": "r1"},
    )
    replica.heartbeat()
    assert drained == [1]  # applied once


def test_a_broken_health_hook_is_unhealthy_not_fatal():
    replica = Replica("r1", backend="b", transport=RecordingTransport(), health=lambda: 1 / 0)
    healthy, detail = replica.health()
    assert not healthy and "ZeroDivisionError" in detail


SELF_RESTARTING = """
import os, sys, time
from pathlib import Path
from brakeline.inference import Replica
from brakeline._transport import Response

log = Path(sys.argv[1])
with log.open("a") as out:
    out.write(f"{os.getpid()} {' '.join(sys.argv[2:])}\\n")
if len(log.read_text().splitlines()) == 1:

    class Console:
        def post(self, path, body):
            return Response(200, {"status": "restarting", "commands": [{"action": "restart"}]})

    Replica("r1", backend="b", transport=Console()).heartbeat()  # never returns
"""


def test_restart_starts_the_same_command_again_after_this_process_exits(tmp_path):
    script, log = tmp_path / "replica.py", tmp_path / "starts.log"
    script.write_text(SELF_RESTARTING)
    env = {"PYTHONPATH": str(ROOT / "sdk"), "PATH": "/usr/bin:/bin"}
    first = subprocess.run(
        [sys.executable, str(script), str(log), "--port", "8101"], env=env, timeout=60
    )
    assert first.returncode == 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(log.read_text().splitlines()) < 2:
        time.sleep(0.05)
    starts = [line.split(" ", 1) for line in log.read_text().splitlines()]
    assert len(starts) == 2, starts
    assert starts[0][0] != starts[1][0]  # another process
    assert starts[0][1] == starts[1][1] == "--port 8101"  # the same command line
