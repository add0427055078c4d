"""Acknowledgements on their own: what each one carries and where it is queued, with a
recording outbox in place of the control loop (no run, no threads)."""

from __future__ import annotations

import json
from typing import Any

from brakeline._acks import Acknowledgements


class RecordingOutbox:
    def __init__(self, delivered: bool = True) -> None:
        self.queued: list[tuple[str, str, dict[str, Any], bool]] = []
        self.waited: list[tuple[str, float]] = []
        self.delivered = delivered

    def enqueue(self, key: str, path: str, body: bytes, urgent: bool = False) -> None:
        self.queued.append((key, path, json.loads(body), urgent))

    def wait_delivered(self, key: str, timeout: float) -> bool:
        self.waited.append((key, timeout))
        return self.delivered


def test_an_ack_is_queued_urgently_under_its_command_and_recorded():
    outbox = RecordingOutbox()
    acks = Acknowledgements(outbox, rank=0, multi_rank=False, wait_seconds=3.0)
    acks.ack(7, "succeeded", {"step": 4})
    body = {"status": "succeeded", "result": {"step": 4}}
    assert outbox.queued == [("ack:7", "commands/7/ack", body, True)]
    assert acks.sent == [{"id": 7, **body}]


def test_a_failed_ack_carries_its_error():
    outbox = RecordingOutbox()
    acks = Acknowledgements(outbox, rank=0, multi_rank=False, wait_seconds=3.0)
    acks.ack("c", "failed", None, "no optimizer")
    assert outbox.queued[0][2] == {"status": "failed", "result": {}, "error": "no optimizer"}


def test_a_rank_of_several_names_itself_and_the_step_it_was_meant_to_apply_at():
    outbox = RecordingOutbox()
    acks = Acknowledgements(outbox, rank=3, multi_rank=True, wait_seconds=3.0)
    acks.note_apply_at(9, 120)
    acks.ack(9, "succeeded", {"step": 120})
    acks.ack(10, "succeeded", {"step": 121})
    results = [queued[2]["result"] for queued in outbox.queued]
    assert results == [
        {"step": 120, "apply_at_step": 120, "rank": 3},
        {"step": 121, "rank": 3},  # the stamp belonged to command 9 only
    ]


def test_a_single_process_does_not_name_a_rank():
    outbox = RecordingOutbox()
    Acknowledgements(outbox, rank=0, multi_rank=False, wait_seconds=3.0).ack(1, "succeeded")
    assert "rank" not in outbox.queued[0][2]["result"]


def test_your_handlers_result_is_merged_once_under_the_built_in_one():
    outbox = RecordingOutbox()
    acks = Acknowledgements(outbox, rank=0, multi_rank=False, wait_seconds=3.0)
    acks.handler_results["5"] = {"mine": True, "step": -1}
    acks.ack(5, "succeeded", {"step": 8})
    acks.ack(6, "succeeded", {"step": 9})
    assert [queued[2]["result"] for queued in outbox.queued] == [
        {"mine": True, "step": 8},  # the built-in result wins where both say the same thing
        {"step": 9},
    ]


def test_waiting_for_an_ack_asks_the_outbox_for_its_key_within_the_wait():
    outbox = RecordingOutbox(delivered=False)
    acks = Acknowledgements(outbox, rank=0, multi_rank=False, wait_seconds=2.5)
    assert acks.wait(11) is False
    assert outbox.waited == [("ack:11", 2.5)]
