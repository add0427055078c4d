"""A real PyTorch training process braked by the real console, then resumed exactly.

The stack is the production one: the SDK in a training subprocess, Daphne (HTTP + websocket),
a real Celery worker evaluating the rules, PostgreSQL and Redis. Nothing is simulated: the
script logs a NaN loss at step NAN_AT, the default rule pack's L3 rule raises the alert, the
system issues checkpoint_and_pause, the SDK stops at the next step boundary, saves, hashes and
acknowledges, and holds until the test resumes it as an on-call engineer would.
"""

from __future__ import annotations

import time

import pytest

from breakers.control.commands import issue_command
from breakers.models import Command, CommandKind, CommandStatus, EnvironmentSnapshot
from incidents.models import Alert, Job, JobStatus
from tests.brakeline.live import points_per_step, sha256_of_path, wait_for

# The worker evaluates the rules (the default pack reinstalled after earlier flushes).
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("worker"),
]

STEPS = 150
NAN_AT = 30
SEED = 1234


def braked_checkpoint(job_id: int, training) -> Command:
    return wait_for(
        lambda: Command.objects.filter(
            job_id=job_id, kind=CommandKind.CHECKPOINT_AND_PAUSE, status=CommandStatus.SUCCEEDED
        ).first(),
        "the automatic checkpoint_and_pause to be acknowledged",
        timeout=60,
        training=training,
    )


def test_a_nan_is_braked_checkpointed_and_the_resume_is_bit_for_bit(live_console, agent, training):
    common = ("--steps", STEPS, "--nan-at", NAN_AT, "--seed", SEED)
    # The uninterrupted reference: same seeds, same NaN, no console (it is never braked).
    reference = training.start("train_torch.py", "reference", *common)
    console = {"url": live_console, "token": agent.token}
    braked = training.start("train_torch.py", "braked", *common, "--step-seconds", 0.02, **console)

    command = braked_checkpoint(agent.job_id, braked)
    result = command.result
    alert = Alert.objects.get(pk=command.alert_id)
    assert alert.severity == "L3" and command.issued_by_kind == "system"
    assert f"step {NAN_AT}" in command.reason
    # Braked after the NaN and well before the end; paused means paused: no step is taken.
    assert NAN_AT <= result["step"] < STEPS - 20
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED
    assert braked.steps_done() == result["step"]
    # The checkpoint exists and is the one acknowledged, byte for byte.
    assert sha256_of_path(result["path"]) == result["sha256"]
    assert result["path"].startswith(str(braked.work_dir / "checkpoints"))
    # A fresh process restored from it (offline) runs while the braked one holds.
    resume = ("--resume-from", result["path"], "--expected-sha256", result["sha256"])
    restored = training.start("train_torch.py", "restored", *common, *resume)
    snapshot = wait_for(
        lambda: EnvironmentSnapshot.objects.filter(job_id=agent.job_id, kind="checkpoint").first(),
        "the checkpoint snapshot",
    )
    assert snapshot.checkpoint_sha256 == result["sha256"] and snapshot.step == result["step"]
    assert snapshot.data["seeds"]["torch"] == SEED
    assert snapshot.data["environment"]["BRAKELINE_SECRET_KEY"] == "<redacted>"
    assert EnvironmentSnapshot.objects.filter(job_id=agent.job_id, kind="start").exists()
    time.sleep(1.0)
    assert braked.steps_done() == result["step"] and braked.process.poll() is None  # held

    issue_command(agent.job_id, CommandKind.RESUME, reason="on-call checked the data: resume")
    assert braked.wait(timeout=60) == 0, braked.tail()
    assert reference.wait(timeout=60) == 0, reference.tail()
    expected = reference.losses_by_step()
    assert len(expected) == STEPS and expected[NAN_AT] == "nan"
    # Paused and resumed in the same process: nothing changed, to the last bit.
    assert braked.losses_by_step() == expected
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.FINISHED

    # The fresh process continued exactly where the checkpoint left off.
    assert restored.wait(timeout=60) == 0, restored.tail()
    resumed = restored.losses_by_step()
    assert sorted(resumed) == list(range(result["step"] + 1, STEPS + 1))
    assert resumed == {step: expected[step] for step in resumed}

    # Every step's loss reached the console once, the NaN included.
    stored = points_per_step(agent.job_id, "loss")
    assert stored == {step: 1 for step in range(1, STEPS + 1)}
