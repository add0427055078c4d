"""The guard's collaborators on their own (no run, no threads): the hold after a refused
update, said to a recording channel in its order, and the non-finite counts added to a log
record."""

from __future__ import annotations

import math
from typing import Any

import torch

from brakeline._commands import CommandInbox
from brakeline._counts import NonFiniteCounts
from brakeline._encoding import LogRecord
from brakeline._guard import StepGuard
from brakeline._hold import GuardHold
from brakeline._settings import resolve_settings
from brakeline._state import RunState


class RecordingChannel:
    def __init__(self, state: RunState, online: bool = True) -> None:
        self._state = state
        self.online = online
        self.said: list[tuple[str, Any]] = []

    def say_status(self, status: str, timeout: float) -> bool:
        self.said.append(("status", (status, self._state.status)))
        return True

    def submit(self, record: LogRecord) -> bool:
        self.said.append(("point", (record.step, record.metrics)))
        return True

    def flush(self, timeout: float) -> bool:
        self.said.append(("flush", None))
        return True


def hold_parts(online: bool = True, **settings: Any):
    resolved = resolve_settings({"job": "j", "url": "", "token": "", **settings})
    state = RunState()
    state.step = 6
    channel = RecordingChannel(state, online)
    inbox = CommandInbox()
    guard = StepGuard(state.next_step)
    return state, channel, inbox, guard, GuardHold(resolved, state, channel, inbox, guard)


def test_without_a_trip_the_boundary_says_nothing():
    _, channel, _, _, hold = hold_parts()
    hold.at_boundary()
    assert channel.said == []


def test_a_trip_says_holding_then_the_refused_point_then_waits_for_a_command():
    state, channel, inbox, guard, hold = hold_parts()
    guard.tripped_step = 7
    guard.skipped_updates = [7]
    inbox.offer({"id": 1, "kind": "checkpoint_and_pause", "params": {}})  # the decision
    hold.at_boundary()
    assert channel.said == [
        ("status", ("holding", "holding")),  # said while the run's status says so
        ("point", (7, {"guard.skipped_updates": 1.0})),
        ("flush", None),
    ]
    assert state.status == "running"  # back as it was: the command applies next
    assert guard.tripped_step is None


def test_a_hold_nobody_answers_ends_after_guard_hold_seconds_and_keeps_heartbeating():
    state, channel, _, guard, hold = hold_parts(guard_hold_seconds=0.3)
    guard.tripped_step = 7
    hold.at_boundary()
    assert state.progress > 0  # held on purpose: heartbeats must not turn it into a hang
    assert state.status == "running"


def test_offline_or_stopping_the_trip_is_taken_without_a_hold():
    for online, stopping in ((False, False), (True, True)):
        state, channel, _, guard, hold = hold_parts(online=online)
        state.stopping = stopping
        guard.tripped_step = 7
        hold.at_boundary()
        assert channel.said == [] and guard.tripped_step is None


def test_a_model_is_counted_once_and_every_counter_adds_to_the_record():
    counts = NonFiniteCounts(StepGuard(lambda: 1))
    model = torch.nn.Linear(2, 1)
    counts.count(model, guarded=False)
    counts.count(model, guarded=False)  # watched again: not a second counter
    assert len(counts.counters) == 1
    model(torch.tensor([[math.nan, 1.0]])).sum().backward()  # one NaN weight gradient
    record = LogRecord(step=1, time=0.0, metrics={})
    counts.attach_to(record)
    assert int(record.grad_nonfinite) == 1
    counts.detach()
