"""A due heartbeat rides inside the metrics batch leaving anyway (protocol 3): one request
instead of two, and never at the cost of the batch or of the heartbeat."""

from __future__ import annotations

import dataclasses
import time

import pytest

from brakeline._transport import Response
from tests.brakeline.conftest import wait_until


def speaks(transport, version: int) -> None:
    """The console answers with its protocol version, as Brakeline-Protocol says."""

    def answer(path, body):
        return dataclasses.replace(transport.default_answer(path, body), protocol=version)

    transport.responder = answer


def riding(transport) -> list[dict]:
    return [body["heartbeat"] for body in transport.bodies("metrics") if "heartbeat" in body]


def train(run, steps: int, pause: float = 0.01) -> None:
    for step in range(1, steps + 1):
        run.log({"loss": 1.0 / step}, step=step)
        run.step_boundary(step)
        time.sleep(pause)


def test_heartbeats_ride_in_batches_once_the_console_takes_them(make_run, transport):
    speaks(transport, 3)
    run = make_run(rank=2, heartbeat_interval=0.2, flush_interval=0.05)
    train(run, 60)
    beats = wait_until(lambda: riding(transport))
    assert beats[0]["rank"] == 2 and beats[0]["status"] == "running"
    # After the first (which tells the SDK the console's version), heartbeats travel in
    # batches while batches leave: at most the first one or two went on their own.
    assert len(transport.bodies("heartbeat")) <= 2
    assert len(riding(transport)) >= 2


def test_an_older_console_gets_heartbeats_of_their_own(make_run, transport):
    speaks(transport, 2)
    run = make_run(heartbeat_interval=0.1, flush_interval=0.05)
    train(run, 40)
    wait_until(lambda: len(transport.bodies("heartbeat")) >= 3)
    assert riding(transport) == []


def test_a_status_change_goes_at_once_on_its_own(make_run, transport):
    speaks(transport, 3)
    run = make_run(heartbeat_interval=30.0, flush_interval=0.05)
    train(run, 5)
    before = len(transport.bodies("heartbeat"))
    assert run.control.say_status("running", 5.0)  # what a holding rank's guard does
    assert len(transport.bodies("heartbeat")) == before + 1


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, {"error": "invalid", "fields": {"heartbeat.hostname": "must be one node's name"}}),
        (409, {"error": "conflict", "detail": "this job finished; start a new job"}),
    ],
)
def test_a_refused_heartbeat_does_not_cost_the_batch(make_run, transport, status, body):
    def refuse_riders(path, sent):
        if path == "metrics" and "heartbeat" in sent:
            return Response(status, body, protocol=3)
        return dataclasses.replace(transport.default_answer(path, sent), protocol=3)

    transport.responder = refuse_riders
    run = make_run(heartbeat_interval=0.1, flush_interval=0.05)
    train(run, 40)
    assert run.flush(10)
    # Every point arrived (the batch went again without the heartbeat), heartbeats went on
    # on their own, and no batch was dropped as refused.
    accepted = [b for b in transport.bodies("metrics") if "heartbeat" not in b]
    steps = sorted(p["step"] for b in accepted for p in b["points"] if p["name"] == "loss")
    assert steps == list(range(1, 41))
    assert run.sender.refused_batches == 0
    count = len(transport.bodies("heartbeat"))
    run.step_boundary(41)
    wait_until(lambda: len(transport.bodies("heartbeat")) > count)
    assert len(riding(transport)) == 1


def test_a_lost_batch_sends_its_heartbeat_on_its_own(make_run, transport):
    def batches_fail(path, body):
        if path == "metrics":  # the batch stays pending, retried: the heartbeat rides in it
            return Response(503, {"error": "unavailable"}, retry_after=0.01, protocol=3)
        return dataclasses.replace(transport.default_answer(path, body), protocol=3)

    transport.responder = batches_fail
    run = make_run(heartbeat_interval=0.3, flush_interval=0.05)
    wait_until(lambda: transport.bodies("heartbeat"))  # the console's version is known
    train(run, 20, pause=0.0)  # then no progress: no heartbeat body of its own is built
    wait_until(lambda: riding(transport))
    at = len(transport.calls)
    # The heartbeat that rode in the lost batch is sent by the control loop itself, at once.
    wait_until(lambda: [b for _, p, b in transport.calls[at - 1 :] if p == "heartbeat"])
    sent = [b for _, p, b in transport.calls[at - 1 :] if p == "heartbeat"]
    assert sent[0]["step"] == 20
