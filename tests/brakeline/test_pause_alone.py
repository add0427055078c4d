"""The pause controller on its own, given only what it uses of a run: the run's state, inbox,
acknowledgements, step pace, wrapped loaders and the run's acts it starts (recorded here),
with the commands a hold applies (no run, no threads)."""

from __future__ import annotations

from typing import Any

from brakeline import CheckpointResult
from brakeline._acks import Acknowledgements
from brakeline._commands import Command, CommandInbox
from brakeline._drill import DrillFaults
from brakeline._pace import StepPace
from brakeline._pause import PauseController, PauseInfo, PauseState, RunActs
from brakeline._ranksync import BoundaryCommands, RankAgreement
from brakeline._settings import resolve_settings
from brakeline._state import RunState
from tests.brakeline.test_acks import RecordingOutbox

SAVED = CheckpointResult(path="/ckpt/3", bytes=9, seconds=0.1, sha256="ab", step=3)


def controller(loaders: list[Any] | None = None):
    """A controller wired as the run wires it, with the run's acts recorded in ``asked``."""
    state, inbox = RunState(), CommandInbox()
    acks = Acknowledgements(RecordingOutbox(), rank=0, multi_rank=False, wait_seconds=1.0)
    asked: list[tuple[Any, ...]] = []

    def roll_back(params: Any) -> dict[str, Any]:
        asked.append(("roll back", params["checkpoint"]))
        return {"rolled_back": params["checkpoint"]}

    acts = RunActs(
        set_status=lambda status: asked.append(("status", status)),
        call_hooks=lambda name, info: asked.append((name, info.step)),
        roll_back=roll_back,
        announce_resume=lambda checkpoint: asked.append(("resume snapshot", checkpoint)),
    )
    pause = PauseController(state, inbox, acks, StepPace(state.next_step), loaders or [], acts)
    settings = resolve_settings({"job": "j", "url": "", "token": ""})
    drill = DrillFaults("the run")  # type: ignore[arg-type]  # never planned on here
    commands = BoundaryCommands(
        "the run", settings, state, inbox, acks, RankAgreement("off"), pause, drill, lambda: None
    )
    pause.commands = commands
    return pause, commands, inbox, acks, asked


def command(command_id: int, kind: str) -> Command:
    parsed = Command.from_json({"id": command_id, "kind": kind})
    assert parsed is not None
    return parsed


def test_save_confirm_release_hold_resume_asks_the_run_for_its_acts_in_that_order():
    pause, commands, inbox, acks, asked = controller()
    commands.handlers["resume"] = lambda run, c, step: {"judged_by": run}
    inbox.offer({"id": 2, "kind": "isolate_node"})  # applied inside the hold
    inbox.offer({"id": 3, "kind": "resume"})
    pause.checkpoint_and_pause(command(1, "checkpoint_and_pause"), 3, lambda: SAVED)
    assert asked == [
        ("status", "checkpointing"),  # saving
        ("status", "checkpointing"),  # confirming
        ("status", "checkpointing"),  # released
        ("release", 3),
        ("status", "paused"),
        ("status", "running"),
        ("resume", 3),
        ("resume snapshot", SAVED),
    ]
    assert [(ack["id"], ack["status"]) for ack in acks.sent] == [
        (1, "succeeded"),
        (2, "failed"),  # isolate_node without a handler of yours: not applicable here
        (3, "succeeded"),
    ]
    assert acks.sent[2]["result"]["judged_by"] == "the run"  # your handler gets the run
    assert pause.state is PauseState.RUNNING


def test_a_resume_naming_a_checkpoint_has_the_run_roll_back_and_announces_that_one():
    pause, _, inbox, acks, asked = controller()
    inbox.offer({"id": 2, "kind": "resume", "params": {"checkpoint": "/ckpt/1"}})
    pause.hold(5, PauseInfo(5, 1, "NaN", SAVED))
    assert ("roll back", "/ckpt/1") in asked
    assert asked[-1] == ("resume snapshot", "/ckpt/1")
    assert acks.sent[0]["result"]["rolled_back"] == "/ckpt/1"


def test_pause_data_with_a_wrapped_loader_leaves_the_hold_to_the_loaders_gate():
    pause, _, _, acks, asked = controller(loaders=["a wrapped loader"])
    result = pause.pause_data(command(1, "pause_data"), 4)
    assert result == {"step": 4, "where": "data_loader"}
    assert pause.data_paused and pause.state is PauseState.RUNNING
    assert acks.sent == [] and asked == []  # the command's own ack follows from its result
