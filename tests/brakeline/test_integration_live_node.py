"""One conversation per node, for real: two torchrun launchers on this machine, each a node
of 2 ranks (--nnodes 2, gloo, a rendezvous on 127.0.0.1), against the real console and its
worker. Every rank's requests go through its node's forwarder (local rank 0) as bundles, and
the brake still holds every rank at one step — with the node's one websocket and without it
— and still does when the forwarder dies as the ranks reach the NaN."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from breakers.control.commands import issue_command
from breakers.models import Command, CommandAck, CommandKind, CommandStatus
from incidents.models import Job, JobRank, JobStatus
from tests.brakeline.live import SCRIPTS, training_environment
from tests.brakeline.test_integration_live_rank_sync import brake_held_by_every_rank
from tests.conftest import ROOT, free_port

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("worker"),
]

NAN_AT = 15
NODES, PER_NODE = 2, 2
RANKS = NODES * PER_NODE


def launch_node(tmp_path, env, node: int, port: int, *args: str) -> subprocess.Popen:
    log = (tmp_path / f"node-{node}.log").open("w")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(NODES),
        "--node_rank",
        str(node),
        "--nproc_per_node",
        str(PER_NODE),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(port),
        str(SCRIPTS / "train_rank_sync.py"),
        str(tmp_path),
        "--nan-at",
        str(NAN_AT),
        "--jitter",
        "0.01",
        *args,
    ]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def brake_two_nodes(live_console, agent, tmp_path, *args: str) -> tuple[Command, list[dict]]:
    """Both nodes train to the NaN; every rank holds at the brake's one step; resumed, every
    rank stops there. Returns the brake and the ranks' reports."""
    env = training_environment(live_console, agent.token)
    env["BRAKELINE_NODE_DIR"] = str(tmp_path / "node-sockets")
    port = free_port()
    nodes = [launch_node(tmp_path, env, node, port, *args) for node in range(NODES)]
    logs = [tmp_path / f"node-{node}.log" for node in range(NODES)]
    try:
        command = brake_held_by_every_rank(agent.job_id, RANKS, logs[0], timeout=180)
        job = Job.objects.get(pk=agent.job_id)
        assert job.status == JobStatus.PAUSED and job.world_size == RANKS
        issue_command(agent.job_id, CommandKind.RESUME, reason="checked: resume")
        for process, log in zip(nodes, logs, strict=True):
            assert process.wait(timeout=180) == 0, log.read_text()[-3000:]
    finally:
        for process in nodes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(RANKS)]
    assert all(r["held_at"] == [command.apply_at_step] for r in reports), reports
    assert all(r["last_step"] == command.apply_at_step for r in reports), reports
    resume = Command.objects.get(job_id=agent.job_id, kind=CommandKind.RESUME)
    assert resume.status == CommandStatus.SUCCEEDED
    assert CommandAck.objects.filter(command=resume).count() == RANKS
    # The console kept every rank apart: its own heartbeat row for each of the four.
    assert set(JobRank.objects.filter(job_id=agent.job_id).values_list("rank", flat=True)) == {
        0,
        1,
        2,
        3,
    }
    return command, reports


@pytest.mark.parametrize("without_websocket", ["", "0,1,2,3"], ids=["websocket", "no-websocket"])
def test_two_nodes_brake_every_rank_at_one_step_through_their_forwarders(
    live_console, agent, tmp_path, settings, without_websocket
):
    settings.COMMAND_APPLY_MARGIN_SECONDS = 0.5
    command, reports = brake_two_nodes(
        live_console, agent, tmp_path, "--no-websocket", without_websocket
    )
    assert command.apply_at_step >= NAN_AT
    # Every rank spoke through its node's forwarder, and the job's requests went mostly through
    # them (a rank posts directly, by design, while its node's forwarder is not up yet: under
    # load local rank 0 may start seconds after the others); each node's local rank 0 sent
    # bundles of several parts (the ranks 0 and 2 are the nodes' local rank 0).
    assert all(r["node"]["through_node"] > 0 for r in reports), reports
    through = sum(r["node"]["through_node"] for r in reports)
    assert through > sum(r["node"]["direct"] for r in reports), reports
    for first in (0, 2):
        traffic = reports[first]["node"]
        assert traffic["bundles"] > 0 and traffic["parts"] > traffic["bundles"], reports


def test_a_dead_forwarder_never_lets_a_rank_train_past_the_brake(
    live_console, agent, tmp_path, settings
):
    settings.COMMAND_APPLY_MARGIN_SECONDS = 0.5
    # Both forwarders end at the NaN's step, before the guard holds: the ranks hold and hear
    # the brake without them (their own requests, then their own websockets).
    command, reports = brake_two_nodes(
        live_console, agent, tmp_path, "--stop-forwarder-at", str(NAN_AT)
    )
    assert all(r["node"]["direct"] > 0 for r in reports), reports
    log = (tmp_path / "node-0.log").read_text()
    assert "stopped its node's forwarder" in log and "talks to the console directly" in log
