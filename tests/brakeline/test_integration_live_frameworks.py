"""The same automatic brake through the frameworks' own hooks, against the real console.

Lightning: the callback's batch end is the step boundary, the checkpoint is
``trainer.save_checkpoint``; the test then terminates the job (exit code 75).
Hugging Face: the Trainer hides the NaN loss from its logs, yet the job is braked (its
grad_norm is NaN, and the SDK's counter reports the masked loss as ``nonfinite.loss``); the
checkpoint is the Trainer's own folder; the test resumes the job and it finishes.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from breakers.checkpoints import catalogue
from breakers.control.commands import issue_command
from breakers.models import Command, CommandKind, CommandStatus
from breakers.storage.points import stored_points
from incidents.models import Job, JobStatus
from tests.brakeline.live import sha256_of_path, wait_for

# The worker evaluates the rules (the default pack reinstalled after earlier flushes).
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("worker"),
]

NAN_AT = 12
PACE = ("--nan-at", NAN_AT, "--step-seconds", 0.02)  # 20 ms a step: time for the brake


def acknowledged(job_id: int, kind: str, training) -> Command:
    return wait_for(
        lambda: Command.objects.filter(
            job_id=job_id, kind=kind, status=CommandStatus.SUCCEEDED
        ).first(),
        f"{kind} to be acknowledged",
        timeout=60,
        training=training,
    )


def assert_paused_on_a_verified_checkpoint(job_id: int, training) -> dict:
    result = acknowledged(job_id, CommandKind.CHECKPOINT_AND_PAUSE, training).result
    assert NAN_AT <= result["step"] < NAN_AT + 40
    assert sha256_of_path(result["path"]) == result["sha256"]
    assert Job.objects.get(pk=job_id).status == JobStatus.PAUSED
    steps = training.steps_done()
    time.sleep(0.5)
    assert training.steps_done() == steps and training.process.poll() is None  # held
    return result


def assert_listed_clean(job_id: int, result: dict) -> dict:
    """The guard refused the NaN step's update: the brake's checkpoint holds the updates up to
    the step before, and the console lists it so (clean, the one a roll back offers first)."""
    assert result["step"] == NAN_AT and result["weights_step"] == NAN_AT - 1
    entry = next(e for e in catalogue(job_id) if e["sha256"] == result["sha256"])
    assert entry["weights_step"] == NAN_AT - 1
    assert entry["clean"] is True and entry["preselected"] is True
    return entry


def test_lightning_is_braked_then_terminated(live_console, agent, training):
    console = {"url": live_console, "token": agent.token}
    run = training.start("train_lightning.py", "lightning", "--steps", 200, *PACE, **console)
    result = assert_paused_on_a_verified_checkpoint(agent.job_id, run)
    assert result["path"].endswith(f"step-{result['step']:08d}.ckpt")
    assert run.steps_done() == result["step"]
    assert_listed_clean(agent.job_id, result)
    state = torch.load(result["path"], weights_only=False)["state_dict"]
    assert all(torch.isfinite(tensor).all() for tensor in state.values())

    issue_command(agent.job_id, CommandKind.TERMINATE, reason="on-call: roll back instead")
    assert run.wait(timeout=60) == 75, run.tail()
    terminate = acknowledged(agent.job_id, CommandKind.TERMINATE, run)
    assert terminate.result["graceful_stop"] is True
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.TERMINATED
    assert run.steps_done() == result["step"]  # not one step after the pause


def test_hugging_face_is_braked_although_its_logs_hide_the_nan(live_console, agent, training):
    console = {"url": live_console, "token": agent.token}
    run = training.start("train_hf.py", "hf", "--steps", 120, *PACE, **console)
    result = assert_paused_on_a_verified_checkpoint(agent.job_id, run)
    assert result["path"] == str(run.work_dir / "hf" / f"checkpoint-{result['step']}")
    assert_listed_clean(agent.job_id, result)

    def values(name: str) -> dict[int, float]:
        return {p.step: p.value for p in stored_points(agent.job_id, name)}

    # What the Trainer logged for the NaN step is a finite stand-in; the SDK saw the truth.
    assert math.isfinite(values("loss")[NAN_AT])
    assert values("nonfinite.loss")[NAN_AT] >= 1
    assert math.isnan(values("grad_norm")[NAN_AT])

    issue_command(agent.job_id, CommandKind.RESUME, reason="on-call: resume")
    assert run.wait(timeout=60) == 0, run.tail()
    assert run.steps_done() == 120
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.FINISHED
