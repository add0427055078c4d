"""Applying commands at a boundary on its own (no run, no threads): your handler's answer
decides the acknowledgement, the ranks' agreement decides which commands are due, and a save
the framework makes later keeps the commands behind it waiting."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from brakeline._acks import Acknowledgements
from brakeline._commands import ACK_LATER, CommandFailed, CommandInbox
from brakeline._drill import DrillFaults
from brakeline._pause import PauseState
from brakeline._ranksync import BoundaryCommands, RankAgreement
from brakeline._settings import resolve_settings
from brakeline._state import RunState
from tests.brakeline.test_acks import RecordingOutbox


class AgreedElsewhere:
    """Another rank has command ``agreed`` due at every agreement boundary."""

    every = 1

    def __init__(self, agreed: int) -> None:
        self.agreed = agreed

    def active(self) -> bool:
        return True

    def agree(self, step: int, due_id: int) -> tuple[int, int, int]:
        return max(due_id, self.agreed), step, step


def parts(agreement: Any = None, **settings: Any):
    resolved = resolve_settings({"job": "j", "url": "", "token": "", **settings})
    state, inbox, outbox = RunState(), CommandInbox(), RecordingOutbox()
    acks = Acknowledgements(outbox, rank=1, multi_rank=True, wait_seconds=1.0)
    pause = SimpleNamespace(state=PauseState.RUNNING)
    asked: list[int] = []
    commands = BoundaryCommands(
        "the run",  # what handlers receive
        resolved,
        state,
        inbox,
        acks,
        agreement or RankAgreement("off"),
        pause,  # type: ignore[arg-type]
        DrillFaults("the run"),  # type: ignore[arg-type]
        lambda: asked.append(1),
    )
    return commands, inbox, acks, pause, asked


def offer(inbox: CommandInbox, command_id: int, kind: str = "isolate_node", **fields: Any):
    inbox.offer({"id": command_id, "kind": kind, "params": {}, **fields})


def test_your_handlers_answer_decides_the_acknowledgement():
    commands, inbox, acks, _, _ = parts()
    received = []

    def mine(target: Any, command: Any, step: int) -> Any:
        received.append(target)
        if command.id == 1:
            return {"drained": True}
        if command.id == 2:
            raise CommandFailed("no scheduler here", {"why": "test"})
        if command.id == 3:
            raise KeyError("broken")
        return ACK_LATER

    commands.handlers["isolate_node"] = mine
    for command_id in (1, 2, 3, 4):
        offer(inbox, command_id)
    commands.at_boundary(5)
    assert received == ["the run"] * 4
    assert [(ack["id"], ack["status"], ack.get("error")) for ack in acks.sent] == [
        (1, "succeeded", None),
        (2, "failed", "no scheduler here"),
        (3, "failed", "KeyError: 'broken'"),
    ]  # command 4: the handler took it over and acknowledges it itself
    assert acks.sent[1]["result"] == {"why": "test", "rank": 1}


def test_a_command_stamped_with_its_step_waits_for_it_and_says_so_in_its_ack():
    commands, inbox, acks, _, _ = parts()
    offer(inbox, 7, apply_at_step=10)
    commands.at_boundary(9)
    assert acks.sent == []
    commands.at_boundary(10)
    assert acks.sent[0]["result"]["apply_at_step"] == 10


def test_a_command_another_rank_applies_here_is_awaited_and_asked_for_again():
    commands, inbox, acks, _, asked = parts(AgreedElsewhere(9), agreement_wait_seconds=0.2)
    commands.at_boundary(3)  # never arrives: the rank goes on without it
    assert acks.sent == [] and asked
    offer(inbox, 9)
    commands.at_boundary(4)
    assert [ack["id"] for ack in acks.sent] == [9]


def test_a_save_the_framework_makes_later_keeps_the_commands_behind_it_waiting():
    commands, inbox, acks, pause, _ = parts()
    pause.state = PauseState.SAVE_REQUESTED
    offer(inbox, 1)
    commands.at_boundary(2)
    assert acks.sent == [] and inbox.has_pending
