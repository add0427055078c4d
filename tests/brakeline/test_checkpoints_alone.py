"""Checkpoints and roll back on their own (no run, no threads): a save says "checkpointing"
while it writes, is labelled by the guard and reported to the catalogue; a roll back restores
in place, moves the step and drops the batches it was told to skip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from brakeline._checkpoint import TrainingObjects
from brakeline._commands import CommandFailed
from brakeline._guard import StepGuard
from brakeline._pace import StepPace
from brakeline._rollback import Checkpoints
from brakeline._settings import resolve_settings
from brakeline._state import RunState


class RecordingOutbox:
    def __init__(self) -> None:
        self.queued: list[tuple[str, str, dict[str, Any]]] = []

    def enqueue(self, key: str, path: str, body: bytes, urgent: bool = False) -> None:
        self.queued.append((key, path, json.loads(body)))


def parts(tmp_path: Path, training: TrainingObjects | None = None):
    settings = resolve_settings(
        {"job": "j", "url": "", "token": "", "rank": 2, "checkpoint_dir": str(tmp_path)}
    )
    state, outbox, statuses = RunState(), RecordingOutbox(), []
    guard = StepGuard(state.next_step)
    training = training or TrainingObjects()

    def set_status(status: str) -> None:
        statuses.append(status)
        state.status = status

    checkpoints = Checkpoints(
        settings, state, training, guard, StepPace(state.next_step), outbox, set_status
    )
    return checkpoints, state, guard, outbox, statuses


def test_a_save_says_checkpointing_while_it_writes_and_is_reported_with_its_label(tmp_path):
    checkpoints, state, guard, outbox, statuses = parts(tmp_path)
    seen_while_saving = []

    def saver(path: Path, step: int) -> None:
        seen_while_saving.append(state.status)
        path.write_text(f"step {step}")

    checkpoints.set_saver(saver, suffix=".txt")
    guard.weights_step = 4  # the guard refused step 5's update
    result = checkpoints.save(5, "manual")
    assert seen_while_saving == ["checkpointing"] and statuses == ["checkpointing", "running"]
    assert result.path.endswith(".txt") and result.weights_step == 4
    assert checkpoints.last is result
    key, path, body = outbox.queued[0]
    assert (key, path) == (f"checkpoint:{result.sha256}", "checkpoints")
    assert (body["step"], body["rank"], body["weights_step"], body["reason"]) == (5, 2, 4, "manual")


def test_nothing_watched_and_no_saver_is_nothing_to_save(tmp_path):
    checkpoints, _, _, outbox, statuses = parts(tmp_path)
    with pytest.raises(RuntimeError, match="nothing to checkpoint"):
        checkpoints.save(1, "manual")
    assert statuses == [] and outbox.queued == []


def test_a_roll_back_restores_in_place_and_drops_the_batches_it_skips(tmp_path):
    model = torch.nn.Linear(2, 1)
    training = TrainingObjects(models=[model])
    checkpoints, state, guard, _, _ = parts(tmp_path, training)
    saved = checkpoints.save(3, "manual")
    with torch.no_grad():
        model.weight.fill_(7.0)
    state.step = 6
    params = {"checkpoint": saved.path, "sha256": saved.sha256, "skip_steps": [2, 4, 5]}
    result = checkpoints.roll_back(params)
    assert (result["restored_step"], result["skip_steps"]) == (3, [4, 5])
    assert state.step == 3 and guard.weights_step == 3
    assert not torch.equal(model.weight, torch.full_like(model.weight, 7.0))
    assert checkpoints.skip_batch() and state.step == 4  # step 4's batch is dropped
    assert checkpoints.skip_batch() and state.step == 5
    assert not checkpoints.skip_batch() and state.step == 5


def test_a_roll_back_refuses_a_checkpoint_that_changed_and_one_of_your_own_saver(tmp_path):
    training = TrainingObjects(models=[torch.nn.Linear(2, 1)])
    checkpoints, state, _, _, _ = parts(tmp_path, training)
    saved = checkpoints.save(3, "manual")
    state.step = 6
    with pytest.raises(CommandFailed, match="has sha256"):
        checkpoints.roll_back({"checkpoint": saved.path, "sha256": "0" * 64})
    checkpoints.set_saver(lambda path, step: path.write_text("mine"))
    with pytest.raises(CommandFailed, match="your own saver"):
        checkpoints.roll_back({"checkpoint": saved.path})
    assert state.step == 6


def test_a_save_at_the_state_a_checkpoint_holds_keeps_that_file(tmp_path):
    """A loop's periodic save right after a brake, or after a roll back to that very step,
    would replace the catalogued file with other bytes (the RNG moved on): its hash would no
    longer match and the clean state would be gone. Once a step is trained, a save writes."""
    model = torch.nn.Linear(2, 1)
    checkpoints, state, guard, outbox, _ = parts(tmp_path, TrainingObjects(models=[model]))
    state.step, guard.weights_step = 20, 19  # the brake at step 20 refused its update
    brake = checkpoints.save(20, "brake")
    assert checkpoints.save(20, "manual") is brake  # the loop's "every 10 steps" save
    with torch.no_grad():
        model.weight.fill_(7.0)
    state.step = 26
    checkpoints.roll_back({"checkpoint": brake.path, "sha256": brake.sha256})
    kept = checkpoints.save(20, "manual")
    assert (kept.path, kept.sha256, kept.reason) == (brake.path, brake.sha256, "restored")
    assert len(outbox.queued) == 1  # the catalogue heard of the file once
    state.step, guard.weights_step = 21, 21
    later = checkpoints.save(21, "manual")
    assert later.path != brake.path and len(outbox.queued) == 2
    with torch.no_grad():
        model.weight.fill_(3.0)
    state.step, guard.weights_step = 20, 20  # the same step's number, another state: written
    assert checkpoints.save(20, "manual").sha256 != brake.sha256
