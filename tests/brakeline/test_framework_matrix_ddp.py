"""The framework matrix's data-parallel rows: real torchrun + gloo ranks, the model in torch's
own DistributedDataParallel, the real console and its worker.

On one rank, at one step, the loss, one gradient or the input batch turns non-finite; DDP's
all-reduce spreads it to every rank's gradients. Each row asserts what the other rows of the
matrix assert (tests/brakeline/matrix.py), per rank and as the console lists it: the faulty
update refused on every rank (its weights bit-equal to those before that step: 0 poisoned
updates), every rank held at one step (0 steps past), every weight finite where it held, and
the brake's checkpoint labelled with the last step its weights hold — clean exactly when that
is before the fault.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from breakers.checkpoints import catalogue
from breakers.control.commands import issue_command
from breakers.models import CommandKind
from incidents.models import Job, JobStatus
from tests.brakeline.live import training_environment
from tests.brakeline.test_integration_live_rank_sync import (
    NAN_AT,
    brake_held_by_every_rank,
    torchrun,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("worker"),
]


@pytest.mark.parametrize(
    ("wrapper", "ranks", "fault"),
    # ~15-30 s each on a loaded machine (torch's imports and DDP's set-up in every rank).
    [
        ("ddp", 2, "nan-loss"),
        ("ddp", 2, "inf-grad"),
        ("ddp", 4, "poisoned-batch"),
        ("fsdp", 2, "inf-grad"),
        ("fsdp", 2, "nan-loss"),
    ],
    ids=[
        "ddp-2-ranks-nan-loss",
        "ddp-2-ranks-inf-gradient",
        "ddp-4-ranks-poisoned-batch",
        "fsdp-2-ranks-inf-in-one-shard",
        "fsdp-2-ranks-nan-loss",
    ],
)
def test_a_fault_on_one_data_parallel_rank_poisons_no_update_and_holds_every_rank(
    live_console, agent, tmp_path, settings, wrapper, ranks, fault
):
    settings.COMMAND_APPLY_MARGIN_SECONDS = 0.5
    env = training_environment(live_console, agent.token)
    process = torchrun(tmp_path, env, ranks, f"--{wrapper}", "--fault", fault)
    log = tmp_path / "torchrun.log"
    try:
        command = brake_held_by_every_rank(agent.job_id, ranks, log, timeout=180)
        assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED
        listed = catalogue(agent.job_id)
        issue_command(agent.job_id, CommandKind.RESUME, reason="checked: resume")
        assert process.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(ranks)]
    held = command.apply_at_step
    assert all(r["fault_refused"] is True for r in reports), reports  # 0 poisoned updates
    assert all(r["held_at"] == [held] and r["last_step"] == held for r in reports), reports
    assert all(r["finite_at_hold"] == [True] for r in reports), reports
    holds = {r["last_applied"] for r in reports}
    assert len(holds) == 1, reports  # the ranks' weights hold the same steps
    (weights_step,) = holds
    assert weights_step == (NAN_AT - 1 if held == NAN_AT else held), reports
    brake = next(entry for entry in listed if entry["step"] == held)
    assert brake["weights_step"] == weights_step
    assert brake["clean"] is (weights_step < NAN_AT)
