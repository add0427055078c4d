"""The executor stops the whole job through its launcher and every rank, and signals nothing
whose start time is not the one registered (pids wrap); launcher fields on the wire."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.utils import timezone

from breakers.executors.identity import process_is_running
from breakers.executors.local import LocalProcessExecutor
from breakers.models import JobLauncher
from core.processes import process_start_time, this_host
from incidents.heartbeats import record_heartbeat
from incidents.models import Job, JobRank

pytestmark = pytest.mark.django_db

# A launcher holding one worker, as torchrun's agent does (the worker in a session of its own).
LAUNCHER = (
    "import signal, subprocess, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))\n"
    "w = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: time.sleep(0.05)'],"
    " start_new_session=True)\n"
    "print(w.pid, flush=True)\n"
    "try:\n    while True: time.sleep(0.05)\n"
    "finally:\n    w.terminate()\n"
)


@pytest.fixture
def launched(agent):
    """(launcher, worker pid): a real launcher process leading its group, and its worker."""
    env = {**os.environ, "BRAKELINE_TOKEN": agent.token}
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    worker = int(launcher.stdout.readline())
    yield launcher, worker
    for pid in (worker, launcher.pid):
        if process_is_running(pid):
            os.kill(pid, 9)
    launcher.wait(timeout=10)


def _register(agent, launcher_pid: int, worker: int, start_time: int | None) -> None:
    record_heartbeat(
        agent.job_id,
        step=3,
        status="running",
        pid=worker,
        hostname=this_host(),
        rank=0,
        world_size=1,
    )
    now = timezone.now()
    JobLauncher.objects.create(
        job_id=agent.job_id,
        hostname=this_host(),
        pid=launcher_pid,
        pgid=launcher_pid,
        reported_start_time=start_time or 0,
        start_time=start_time,
        ranks=[0],
        first_seen_at=now,
        last_seen_at=now,
    )


def test_the_whole_job_stops_through_the_launchers_process_group(agent, launched):
    launcher, worker = launched
    _register(agent, launcher.pid, worker, process_start_time(launcher.pid))
    outcome = LocalProcessExecutor().stop(Job.objects.get(pk=agent.job_id), grace_seconds=10)
    assert outcome.stopped, outcome
    assert f"SIGTERM to the process group of launcher {launcher.pid} (ranks 0)" in outcome.steps
    assert not any(f"pid {worker})" in step for step in outcome.steps)  # the agent stops it
    assert launcher.wait(timeout=10) != 0 and not process_is_running(worker)


def test_a_launcher_whose_start_time_differs_is_not_signalled(agent, launched):
    launcher, worker = launched
    _register(agent, launcher.pid, worker, process_start_time(launcher.pid) + 1)
    JobRank.objects.filter(job_id=agent.job_id).update(
        pid_start_time=process_start_time(worker) + 1
    )
    outcome = LocalProcessExecutor().stop(Job.objects.get(pk=agent.job_id), grace_seconds=1)
    assert not outcome.stopped
    assert "the pid now belongs to another process" in outcome.detail
    assert process_is_running(launcher.pid) and process_is_running(worker)


def test_a_rank_whose_start_time_differs_is_not_signalled_the_others_are(agent, launched):
    launcher, worker = launched  # here: two independent ranks, no launcher registered
    env = {**os.environ, "BRAKELINE_TOKEN": agent.token}
    other = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"],
        env=env,
        start_new_session=True,
    )
    try:
        record_heartbeat(
            agent.job_id,
            step=3,
            status="running",
            pid=launcher.pid,
            hostname=this_host(),
            rank=0,
            world_size=2,
        )
        record_heartbeat(
            agent.job_id,
            step=3,
            status="running",
            pid=other.pid,
            hostname=this_host(),
            rank=1,
            world_size=2,
        )
        JobRank.objects.filter(job_id=agent.job_id, rank=1).update(pid_start_time=1)
        outcome = LocalProcessExecutor().stop(Job.objects.get(pk=agent.job_id), grace_seconds=5)
        refused = [s for s in outcome.steps if "rank 1" in s and "not sent, refused" in s]
        assert refused and "started at tick" in refused[0], outcome.steps
        assert f"SIGTERM to rank 0 (pid {launcher.pid})" in outcome.steps
        assert launcher.wait(timeout=10) is not None
        assert other.poll() is None  # never signalled
    finally:
        other.kill()
        other.wait()


def test_a_job_with_a_rank_on_another_host_is_refused_whole(agent, launched):
    launcher, worker = launched
    _register(agent, launcher.pid, worker, process_start_time(launcher.pid))
    record_heartbeat(
        agent.job_id, step=3, status="running", pid=4242, hostname="gpu-9", rank=1, world_size=2
    )
    outcome = LocalProcessExecutor().stop(Job.objects.get(pk=agent.job_id), grace_seconds=1)
    assert not outcome.stopped and "rank(s) 1 run on gpu-9" in outcome.detail
    assert process_is_running(launcher.pid)


def _beat(agent_post, **fields):
    body = {"step": 1, "status": "running", "hostname": this_host(), "rank": 0, **fields}
    return agent_post("/api/v1/agent/heartbeat", body)


def test_a_heartbeats_launcher_is_registered_verified_only_as_the_ranks_parent(
    agent, agent_post, launched
):
    launcher, worker = launched
    start = process_start_time(launcher.pid)
    fields = {"launcher_pid": launcher.pid, "launcher_pgid": launcher.pid}
    assert _beat(agent_post, pid=worker, **fields, launcher_start_time=start).status_code == 200
    row = JobLauncher.objects.get(job_id=agent.job_id)
    assert (row.start_time, row.ranks, row.pgid) == (start, [0], launcher.pid)
    # Not its parent: kept, never verified (the executor will not signal it).
    assert (
        _beat(
            agent_post,
            pid=os.getpid(),
            rank=1,
            world_size=2,
            **fields,
            launcher_start_time=start + 5,
        ).status_code
        == 200
    )
    assert (
        JobLauncher.objects.get(job_id=agent.job_id, reported_start_time=start + 5).start_time
        is None
    )


def test_launcher_fields_come_together_and_are_checked(agent_post):
    answer = _beat(agent_post, pid=5, launcher_pid=1, launcher_start_time="x")
    assert answer.status_code == 400
    fields = answer.json()["fields"]
    assert set(fields) == {"launcher_pid", "launcher_pgid", "launcher_start_time"}
