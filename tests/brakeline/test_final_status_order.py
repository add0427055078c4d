"""A run's "finished" heartbeat never overtakes an acknowledgement still queued.

The console ends a job on its "finished" heartbeat (as terminated, when a terminate was
delivered), and from then on the watchdog closes the job's open commands as failed: "no process
is left to apply it". An acknowledgement that reaches it afterwards is too late to count. Under
a loaded console a terminate's ack can time out and wait for its retry while the run finishes;
the heartbeats of that moment say "finished". So the control loop holds the final status back
while an acknowledgement waits, and says it in its last round, after one more try of the acks.
These tests drive the control loop by hand (no thread): what goes out is deterministic."""

from __future__ import annotations

import time

from brakeline._commands import CommandInbox
from brakeline._control import HEARTBEAT_IN_BATCH_PROTOCOL, ControlLoop
from brakeline._transport import Response
from tests.brakeline.conftest import RecordingTransport


def _loop(transport: RecordingTransport, status: list[str]) -> ControlLoop:
    return ControlLoop(transport, CommandInbox(), lambda: {"step": 622, "status": status[0]}, 0.05)


def _console_failing_acks(transport: RecordingTransport, failing: list[bool]) -> None:
    def responder(path, body):
        if path.startswith("commands/") and failing[0]:
            return Response(503, {})
        return None

    transport.responder = responder


def _sent(transport: RecordingTransport) -> list[tuple[str, str]]:
    return [(path, body.get("status", "")) for _, path, body in transport.calls]


def test_a_finished_heartbeat_waits_while_an_ack_is_queued(transport):
    failing, status = [True], ["running"]
    _console_failing_acks(transport, failing)
    loop = _loop(transport, status)
    loop.enqueue("ack:11", "commands/11/ack", lambda: {"status": "succeeded"}, urgent=True)
    loop._tick(time.monotonic())
    assert ("heartbeat", "running") in _sent(transport)  # liveness goes on meanwhile

    status[0] = "finished"  # the run finished, its terminate's ack still undelivered
    for _ in range(3):
        loop._tick(time.monotonic() + 60)  # past any backoff: the ack is tried again
    assert ("heartbeat", "finished") not in _sent(transport)
    loop._console_protocol = HEARTBEAT_IN_BATCH_PROTOCOL
    loop._next_heartbeat = 0.0
    assert loop.ride(1.0) is None  # nor inside a metrics batch

    failing[0] = False
    loop._tick(time.monotonic() + 120)
    sent = _sent(transport)
    assert sent.index(("heartbeat", "finished")) > sent.index(("commands/11/ack", "succeeded"))


def test_the_last_round_says_finished_after_trying_the_acks_once_more(transport):
    failing, status = [True], ["finished"]
    _console_failing_acks(transport, failing)
    loop = _loop(transport, status)
    loop.enqueue("ack:11", "commands/11/ack", lambda: {"status": "succeeded"}, urgent=True)
    loop._tick(time.monotonic())
    assert ("heartbeat", "finished") not in _sent(transport)

    loop._stopping.set()
    loop._run()  # the last round: bounded, so the final status goes out even so
    sent = _sent(transport)
    assert sent[-1] == ("heartbeat", "finished")
    assert sent[-2] == ("commands/11/ack", "succeeded")
