"""Reports that keep coming never hold back an acknowledgement or the heartbeats.

A run that checkpoints every few steps queues a report per checkpoint; on a loaded console each
report's POST takes a while, and new ones arrive faster than they are delivered. The control
loop still posts an acknowledgement queued meanwhile right after the report in flight, and a
heartbeat that came due goes out between two reports: a terminate is confirmed while the run
is alive, and a healthy job is never taken for a silent one. Driven by hand (no thread), so
what goes out, and in which order, is deterministic."""

from __future__ import annotations

import time

from brakeline._commands import CommandInbox
from brakeline._control import ControlLoop

REPORTS = 40  # checkpoint reports the training queues while the first ones are on their way


def _report(loop: ControlLoop, number: int) -> None:
    loop.enqueue(f"checkpoint:{number}", "checkpoints", lambda: {"step": 10 * number})


def test_an_ack_and_heartbeats_go_between_reports_that_keep_coming(transport):
    loop = ControlLoop(transport, CommandInbox(), lambda: {"step": 1, "status": "running"}, 60.0)
    produced = [1]

    def responder(path, body):
        if path == "checkpoints" and produced[0] < REPORTS:
            produced[0] += 1  # the training saved again while this report was on its way
            _report(loop, produced[0])
            if produced[0] == 3:
                loop.enqueue("ack:11", "commands/11/ack", lambda: {"status": "ok"}, urgent=True)
        return None

    transport.responder = responder
    _report(loop, 1)
    for _ in range(3 * REPORTS):  # each tick: what is due, then the loop waits for the next
        loop._tick(time.monotonic())
        loop._next_heartbeat = 0.0  # a heartbeat is due again at once
        if not (loop._outbox or loop._urgent):
            break
    sent = [path for _, path, _ in transport.calls]
    assert sent.count("checkpoints") == REPORTS  # every report still goes, in time
    reports_before_ack = sent[: sent.index("commands/11/ack")].count("checkpoints")
    assert reports_before_ack == 2  # the one it was queued behind, then the ack
    assert sent[:2] == ["checkpoints", "heartbeat"]
    assert sent.count("heartbeat") >= REPORTS // 2  # never starved by the reports
