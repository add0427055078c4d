"""Real torchrun (2 ranks, gloo on CPU) against the real console: both ranks heartbeat through
the SDK, each gets its own rank row with its own pid, the job learns its world size, and it
finishes only when the last rank does; each rank's metric points carry its rank."""

from __future__ import annotations

import subprocess
import sys

import pytest

from breakers.storage.points import stored_points
from incidents.models import Job, JobRank, JobStatus
from tests.brakeline.live import SCRIPTS, training_environment, wait_for
from tests.conftest import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS = 40


def test_two_torchrun_ranks_are_two_ranks_and_the_job_finishes_with_the_last(
    live_console, agent, tmp_path
):
    env = training_environment(live_console, agent.token) | {"BRAKELINE_WEBSOCKET": "0"}
    log = (tmp_path / "torchrun.log").open("w")
    script = [str(SCRIPTS / "train_ddp.py"), str(tmp_path), str(STEPS)]
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        *script,
    ]
    torchrun = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        finished_first = wait_for(
            lambda: JobRank.objects.filter(job_id=agent.job_id, rank=0, status="finished").first(),
            "rank 0's finished heartbeat",
            timeout=120,
        )
        assert finished_first.step == STEPS
        # Rank 1 is still alive (waiting for the go file): the job is not finished.
        job = Job.objects.get(pk=agent.job_id)
        assert job.status == JobStatus.RUNNING and job.world_size == 2
        assert job.heartbeat_deadline is not None  # rank 1's deadline still watched
        (tmp_path / "go").touch()
        assert torchrun.wait(timeout=120) == 0, (tmp_path / "torchrun.log").read_text()[-3000:]
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
        log.close()
    ranks = {r.rank: r for r in JobRank.objects.filter(job_id=agent.job_id)}
    assert set(ranks) == {0, 1}
    assert ranks[0].pid != ranks[1].pid and all(r.status == "finished" for r in ranks.values())
    assert all(r.step == STEPS for r in ranks.values())
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.FINISHED and job.heartbeat_deadline is None
    assert job.agent_pid == ranks[0].pid  # rank 0's process, not whichever beat last
    # Each rank's losses are its own series: one point per step and rank, not two in one.
    losses = stored_points(agent.job_id, "loss")
    for rank in (0, 1):
        steps = [p.step for p in losses if p.rank == rank]
        assert len(steps) == len(set(steps)) == STEPS
