"""Every executor refuses a target that is not the job's (``breakers.executors.targets``).

The executors are enumerated two ways: every module of ``breakers/executors`` that sends a
signal, starts a process or speaks to a scheduler or load balancer must register with the seam,
and every registered executor must have a scenario here, which hands it job B's target while
acting for job A and sees it refused with nothing done. A new executor that skips either step
fails this module.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
from pathlib import Path

import pytest
from django.utils import timezone

import breakers.executors
from breakers.executors import targets
from breakers.models import (
    Command,
    CommandKind,
    InferenceReplica,
    InferenceServer,
    SchedulerBinding,
)
from core.processes import process_start_time, this_host
from incidents.models import JobRank

pytestmark = pytest.mark.django_db
ACTING = re.compile(
    r"os\.kill\(|os\.killpg\(|subprocess\.(Popen|run)\(|run_slurm\(|call_log\.run\(|"
    r"self\.command\(|slurm\.(drain|cancel|requeue)\("
)
# Modules that act only through a registered one (said why).
HELPERS = {
    "breakers.executors.identity": "signal 0 probes only; the stop is whole_job's, registered",
    "breakers.executors.slurm.client": "runs a Slurm client for the registered Slurm modules",
}


def _modules() -> list[str]:
    root = Path(breakers.executors.__file__).parent
    found = pkgutil.walk_packages([str(root)], prefix="breakers.executors.")
    names = [module.name for module in found]
    for name in names:
        importlib.import_module(name)
    return names


def test_every_acting_module_registers_with_the_seam():
    modules = _modules()
    registered = {entry.module for entry in targets.REGISTRY.values()}
    unregistered = []
    for name in modules:
        source = Path(importlib.import_module(name).__file__).read_text()
        if ACTING.search(source) and name not in registered and name not in HELPERS:
            unregistered.append(name)
    assert unregistered == [], "acts without registering with breakers.executors.targets"


def test_every_registered_executor_has_a_foreign_target_scenario():
    _modules()
    assert set(targets.REGISTRY) == set(SCENARIOS)


@pytest.fixture
def jobs(make_agent):
    return make_agent(team="team-a", name="a-job"), make_agent(team="team-b", name="b-job")


@pytest.fixture
def b_process(jobs):
    """A process of job B on this host: it carries B's token, as the SDK's processes do."""
    _, b = jobs
    env = {"PATH": "/usr/bin:/bin", "BRAKELINE_TOKEN": b.token}
    process = subprocess.Popen(["/bin/sleep", "300"], env=env, start_new_session=True)
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def fake_slurm(tmp_path, settings, jobs):
    """Slurm's client commands at the edge: job 900 was submitted for job B on gpu-b, job 901
    for job A on gpu-a; every call is recorded."""
    a, b = jobs
    calls = tmp_path / "calls"
    b_job = f"JobId=900 JobName=t JobState=RUNNING Comment=brakeline:{b.job_id} NodeList=gpu-b"
    a_job = f"JobId=901 JobName=t JobState=RUNNING Comment=brakeline:{a.job_id} NodeList=gpu-a"
    scontrol = (
        f'if [ "$2" = job ] && [ "$4" = 900 ]; then echo "{b_job}"; '
        f'elif [ "$2" = job ] && [ "$4" = 901 ]; then echo "{a_job}"; '
        'elif [ "$2" = hostnames ]; then echo "$3"; fi'
    )
    for tool, answer in {"scontrol": scontrol, "squeue": "echo RUNNING", "scancel": "true"}.items():
        script = tmp_path / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n{answer}\n')
        script.chmod(0o755)
    settings.SLURM_BIN_DIR = str(tmp_path)
    return calls


def _acting_calls(calls: Path) -> list[str]:
    lines = calls.read_text().splitlines() if calls.exists() else []
    return [line for line in lines if line.startswith("scancel") or " update " in line]


def local_stop(request):
    from breakers.executors.local import LocalProcessExecutor

    (a, _), b_process = request.getfixturevalue("jobs"), request.getfixturevalue("b_process")
    JobRank.objects.create(
        job_id=a.job_id,
        rank=0,
        hostname=this_host(),
        pid=b_process.pid,
        pid_start_time=process_start_time(b_process.pid),
        step=1,
        last_heartbeat_at=timezone.now(),
    )
    outcome = LocalProcessExecutor().stop(_job(a), grace_seconds=0.5)
    assert not outcome.stopped and "refused" in outcome.detail
    assert b_process.poll() is None  # job B's process untouched


def local_restart(request):
    from breakers.executors.restart import restart_replica

    (a, _), b_process = request.getfixturevalue("jobs"), request.getfixturevalue("b_process")
    replica = InferenceReplica.objects.create(
        job_id=a.job_id,
        name="r1",
        backend="m",
        hostname=this_host(),
        pid=b_process.pid,
        pid_start_time=process_start_time(b_process.pid),
    )
    outcome = restart_replica(replica, grace_seconds=0.5)
    assert not outcome.stopped and outcome.detail.startswith("refused")
    assert b_process.poll() is None


def haproxy_traffic(request):
    from breakers.executors.traffic import TrafficError
    from breakers.executors.traffic.job_traffic import traffic_executor

    a, b = request.getfixturevalue("jobs")
    haproxy = request.getfixturevalue("haproxy")
    InferenceServer.objects.create(job_id=b.job_id, backend="team-b", server="b1")
    request.getfixturevalue("settings").HAPROXY_SOCKET = haproxy.address
    executor = traffic_executor(a.job_id)
    assert executor is not None
    for act in (executor.drain, executor.maintenance, executor.ready, executor.state):
        with pytest.raises(TrafficError, match="refused"):
            act("team-b", "b1")
    assert haproxy.commands == []


def slurm_stop(request):
    from breakers.executors.slurm.executor import SlurmExecutor

    (a, _), calls = request.getfixturevalue("jobs"), request.getfixturevalue("fake_slurm")
    # Job A's binding names job B's Slurm job.
    SchedulerBinding.objects.create(job_id=a.job_id, executor="slurm", slurm_job_id="900")
    outcome = SlurmExecutor().stop(_job(a), grace_seconds=0.5)
    assert not outcome.stopped and "not submitted for" in outcome.detail
    assert _acting_calls(calls) == []


def slurm_drain(request):
    from breakers.executors.slurm.actions import drain_node

    (a, _), calls = request.getfixturevalue("jobs"), request.getfixturevalue("fake_slurm")
    # Job A runs as Slurm job 901 on gpu-a; the command names job B's node.
    binding = SchedulerBinding.objects.create(
        job_id=a.job_id, executor="slurm", slurm_job_id="901", slurm_nodelist="gpu-a"
    )
    command = Command.objects.create(
        job_id=a.job_id,
        kind=CommandKind.ISOLATE_NODE,
        params={"node": "gpu-b"},
        severity="L3",
        issued_at=timezone.now(),
        deliver_by=timezone.now(),
    )
    assert drain_node(command, binding) is None
    assert _acting_calls(calls) == []
    assert any(line.startswith("scontrol show job") for line in calls.read_text().splitlines())


def _job(agent):
    from incidents.models import Job

    return Job.objects.get(pk=agent.job_id)


SCENARIOS = {
    "local": local_stop,
    "local-restart": local_restart,
    "haproxy": haproxy_traffic,
    "slurm": slurm_stop,
    "slurm-drain": slurm_drain,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_each_executor_refuses_a_target_that_is_not_the_jobs(name, request):
    _modules()
    assert name in targets.REGISTRY
    SCENARIOS[name](request)
