"""The demo's simulated run obeys commands over real HTTP, the way the SDK does."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest

from breakers.control.commands import issue_command
from breakers.models import Command, CommandStatus
from breakers.storage.points import stored_points
from console.simulator import SimulatedRun
from incidents.models import Job, JobStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_simulated_run_streams_then_diverges_to_nan(live_console, agent, tmp_path):
    run = SimulatedRun(
        url=live_console,
        token=agent.token,
        checkpoint_dir=tmp_path,
        diverge_at_step=20,
        nan_at_step=200,
        steps_per_second=10_000,
    )
    run.run(max_steps=210)
    losses = {p.step: p.value for p in stored_points(agent.job_id, "loss")}
    assert len(losses) == 210
    assert all(math.isfinite(losses[s]) for s in range(200)) and math.isnan(losses[205])
    assert losses[150] > 2 * losses[19]  # it diverges before the NaN


def test_checkpoint_pause_resume_cycle(live_console, agent, tmp_path):
    run = SimulatedRun(url=live_console, token=agent.token, checkpoint_dir=tmp_path)
    run.run(max_steps=10)
    pause = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN", severity="L3").command
    run.obey(run.heartbeat())
    pause.refresh_from_db()
    assert pause.status == CommandStatus.SUCCEEDED and run.status == "paused"
    checkpoint = Path(pause.result["path"])
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == pause.result["sha256"]
    assert pause.result["bytes"] == checkpoint.stat().st_size and pause.result["step"] == 10
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED
    resume = issue_command(agent.job_id, "resume", reason="false alarm").command
    run.obey(run.heartbeat())
    assert run.status == "running"
    assert Command.objects.get(pk=resume.pk).status == CommandStatus.SUCCEEDED
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.RUNNING
