"""An L4 of a multi-rank job under Slurm: torchrun (2 ranks, gloo on CPU, --max-restarts=2) in
an sbatch job; the console cancels the Slurm job — the whole job, every rank and the agent —
and drains the node through Slurm itself, and no rank trains again."""

from __future__ import annotations

import sys

import pytest

from breakers.control.commands import issue_command
from breakers.executors.slurm.executor import ENDED_STATES
from breakers.models import Command, CommandKind, CommandStatus, NodeDrain
from incidents.models import JobRank
from tests.brakeline.live import SCRIPTS
from tests.breakers.slurm.conftest import requires_slurm
from tests.breakers.slurm.test_jobs_on_slurm import bound_to_slurm
from tests.conftest import ROOT
from tests.support.waiting import wait_for

pytestmark = [requires_slurm, pytest.mark.django_db(transaction=True)]


def test_l4_cancels_the_whole_torchrun_job_and_drains_its_node_through_slurm(
    slurm_cluster, live_console, worker, agent
):
    folder = slurm_cluster.root / "jobs" / f"torchrun-{agent.job_id}"
    folder.mkdir(parents=True)
    env = slurm_cluster.env(
        PYTHONPATH=f"{ROOT}:{ROOT / 'sdk'}",
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS="1",
        BRAKELINE_URL=live_console,
        BRAKELINE_TOKEN=agent.token,
        BRAKELINE_WEBSOCKET="0",
    )
    torchrun = (
        f"exec {sys.executable} -m torch.distributed.run --standalone --nproc_per_node 2 "
        f"--max-restarts 2 {SCRIPTS / 'train_ranks.py'} {folder} --steps 100000 "
        "--step-seconds 0.02"
    )
    submitted = slurm_cluster.run(
        "sbatch",
        "--parsable",
        f"--comment=brakeline:{agent.job_id}",
        f"--chdir={folder}",
        f"--output={folder}/slurm-%j.out",
        f"--wrap={torchrun}",
        env=env,
    )
    slurm_id = submitted.stdout.strip().split(";")[0]
    bound_to_slurm(agent, slurm_id)
    wait_for(
        lambda: JobRank.objects.filter(job_id=agent.job_id, step__gte=5).count() == 2,
        "both ranks training",
        timeout=120,
    )
    issue_command(agent.job_id, "terminate", reason="L4 test", severity="L4")
    isolate = issue_command(
        agent.job_id,
        "isolate_node",
        reason="L4 test",
        severity="L4",
        params={"node": slurm_cluster.node},
    ).command
    wait_for(lambda: slurm_cluster.job_state(slurm_id) in ENDED_STATES, "the job ended", 60)
    drain = wait_for(lambda: NodeDrain.objects.filter(command=isolate).first(), "the drain", 60)
    assert drain.slurm_node == slurm_cluster.node and "DRAIN" in slurm_cluster.node_state()[0]
    # Done by Slurm and acknowledged on the job's behalf: nothing waits for exited ranks.
    wait_for(
        lambda: Command.objects.get(pk=isolate.pk).status == CommandStatus.SUCCEEDED,
        "the drain acknowledged",
        30,
    )
    assert Command.objects.get(pk=isolate.pk).result["by"] == "slurm"
    terminate = Command.objects.get(job_id=agent.job_id, kind=CommandKind.TERMINATE)
    wait_for(
        lambda: Command.objects.get(pk=terminate.pk).status == CommandStatus.SUCCEEDED,
        "the terminate acknowledged",
        30,
    )
    starts = [line.split() for line in (folder / "starts.txt").read_text().splitlines()]
    assert sorted(s[0] for s in starts) == ["0", "1"] and all(s[1] == "0" for s in starts)
