"""A hung job that never acknowledges is stopped from the outside by the local executor."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

from breakers.control.commands import expire_overdue_commands, issue_command, stop_hung_job
from breakers.executors.identity import process_is_running
from breakers.models import Command, CommandStatus
from incidents.heartbeats import record_heartbeat
from incidents.models import Incident, Job, JobRank, JobStatus
from tests.support.authz import raise_alert

pytestmark = pytest.mark.django_db

# A "training process" that hangs: it never steps, never acknowledges.
HUNG = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)\n"
# One that also ignores SIGTERM, as a process stuck in a collective sometimes does.
HUNG_DEAF = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + HUNG


@pytest.fixture
def hung_process(agent):
    """A hung training process of ``agent``'s job: started (as a job is) in its own session,
    with the job's token in its environment, as a real training process has it."""
    processes = []

    def start(script: str, token: str | None = None) -> subprocess.Popen:
        env = {**os.environ, "BRAKELINE_TOKEN": token or agent.token}
        process = subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        processes.append(process)
        # Signal handlers are in place once it says so; a signal before that would kill it early.
        assert process.stdout.readline().strip() == "ready"
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def overdue_pause(agent, pid: int, hostname: str | None = None) -> Command:
    record_heartbeat(
        agent.job_id, step=5, status="running", pid=pid, hostname=hostname or socket.gethostname()
    )
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="loss is NaN").command
    assert expire_overdue_commands(timezone.now() + timedelta(hours=1)) == [command.pk]
    return command


@pytest.mark.parametrize("script, last_signal", [(HUNG, "SIGTERM"), (HUNG_DEAF, "SIGKILL")])
def test_a_hung_process_is_signalled_until_it_exits(agent, hung_process, script, last_signal):
    process = hung_process(script)
    command = overdue_pause(agent, process.pid)
    outcome = stop_hung_job(command.pk, grace_seconds=0.5)
    assert outcome.stopped and not process_is_running(process.pid)
    assert any(last_signal in step for step in outcome.steps), outcome.steps
    command.refresh_from_db()
    assert command.status == CommandStatus.EXPIRED
    assert command.result["executor"]["stopped"] is True
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.TERMINATED


def test_commands_within_their_deadline_are_left_alone(agent):
    issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN")
    assert expire_overdue_commands(timezone.now()) == []


def test_an_overdue_learning_rate_change_expires_without_stopping_anything(agent):
    command = issue_command(agent.job_id, "lower_lr", reason="L2", params={"factor": 0.5}).command
    assert expire_overdue_commands(timezone.now() + timedelta(hours=1)) == []
    command.refresh_from_db()
    assert command.status == CommandStatus.EXPIRED


def test_expiry_happens_once_even_when_two_watchdogs_race(agent):
    issue_command(agent.job_id, "terminate", reason="XID")
    later = timezone.now() + timedelta(hours=1)
    assert len(expire_overdue_commands(later)) == 1
    assert expire_overdue_commands(later) == []


def test_a_job_on_another_host_is_not_signalled_and_says_why(agent, hung_process):
    process = hung_process(HUNG)
    command = overdue_pause(agent, process.pid, hostname="gpu-node-99")
    outcome = stop_hung_job(command.pk, grace_seconds=0.2)
    assert not outcome.stopped and "gpu-node-99" in outcome.detail
    assert process_is_running(process.pid)
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSING


def test_a_late_acknowledgement_after_expiry_is_still_recorded(agent, agent_post):
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN").command
    expire_overdue_commands(timezone.now() + timedelta(hours=1))
    agent_post(
        f"/api/v1/agent/commands/{command.pk}/ack",
        {"status": "succeeded", "result": {"path": "/c.pt"}},
    )
    command.refresh_from_db()
    assert command.status == CommandStatus.SUCCEEDED and command.result == {"path": "/c.pt"}


# --- Nothing an agent reports aims the local executor at another process (security issue) ------


@pytest.fixture
def victim():
    """Somebody else's process on the console's host: a plain ``sleep``, no Brakeline token."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield process
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def refusal_row(agent) -> str:
    incident = Incident.objects.get(job_id=agent.job_id)
    row = incident.timeline.filter(data__executor__executor="local").get()
    return row.message


@pytest.mark.parametrize("hostname", ["", "this host"])
def test_an_agent_reporting_somebody_elses_pid_does_not_get_it_signalled(
    agent, agent_post, victim, hostname
):
    """The issue's repro: {"pid": <victim>} (with or without this host's name), one NaN, never
    acknowledged: after the deadline the worker must not SIGTERM the victim."""
    beat = {"step": 5, "status": "running", "pid": victim.pid}
    if hostname:
        beat["hostname"] = socket.gethostname()
    assert agent_post("/api/v1/agent/heartbeat", beat).status_code == 200
    alert = raise_alert(agent.job_id, "L3")
    command = issue_command(
        agent.job_id, "checkpoint_and_pause", reason="loss is NaN", alert_id=alert.pk
    ).command
    assert expire_overdue_commands(timezone.now() + timedelta(hours=1)) == [command.pk]
    outcome = stop_hung_job(command.pk, grace_seconds=0.2)
    assert not outcome.stopped and outcome.detail.startswith("refused: ")
    assert victim.poll() is None and process_is_running(victim.pid)  # never signalled
    why = "without naming its host" if not hostname else "does not carry the job's token"
    assert why in outcome.detail
    row = refusal_row(agent)
    assert "refused: " in row and why in row
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSING


def test_the_job_process_heartbeating_its_own_pid_is_signalled(agent, agent_post, tmp_path):
    """A real job process: a Python subprocess that sends its own heartbeat (its pid, this
    host) with the job's token from its environment, then hangs."""
    script = (
        "import json, os, socket, time, urllib.request\n"
        "print(json.dumps({'step': 5, 'status': 'running', 'pid': os.getpid(),"
        " 'hostname': socket.gethostname()}), flush=True)\n"
        "while True: time.sleep(0.05)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "BRAKELINE_TOKEN": agent.token},
        start_new_session=True,
    )
    try:
        # The test client stands in for the HTTP hop: the body is the process's own heartbeat.
        beat = process.stdout.readline()
        assert agent_post("/api/v1/agent/heartbeat", beat).status_code == 200
        job = Job.objects.get(pk=agent.job_id)
        assert job.agent_pid == process.pid and job.agent_pid_start_time is not None
        command = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN").command
        expire_overdue_commands(timezone.now() + timedelta(hours=1))
        outcome = stop_hung_job(command.pk, grace_seconds=2)
        assert outcome.stopped, outcome
        assert process.wait(timeout=10) == -signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def test_a_process_of_another_job_is_not_signalled(agent, make_agent, hung_process):
    other = make_agent()
    process = hung_process(HUNG, token=other.token)  # another job's training process
    command = overdue_pause(agent, process.pid)
    outcome = stop_hung_job(command.pk, grace_seconds=0.2)
    assert not outcome.stopped and "does not carry the job's token" in outcome.detail
    assert process_is_running(process.pid)


def test_a_reused_pid_is_not_signalled(agent, hung_process):
    process = hung_process(HUNG)
    command = overdue_pause(agent, process.pid)
    # The job's process ended and its pid went to another process since it was registered.
    Job.objects.filter(pk=agent.job_id).update(agent_pid_start_time=F("agent_pid_start_time") - 1)
    JobRank.objects.filter(job_id=agent.job_id).update(pid_start_time=F("pid_start_time") - 1)
    outcome = stop_hung_job(command.pk, grace_seconds=0.2)
    assert not outcome.stopped and "the pid now belongs to another process" in outcome.detail
    assert process_is_running(process.pid)


@pytest.mark.parametrize("which", ["pid 1", "the console", "its parent"])
def test_pid_1_and_the_consoles_own_processes_are_never_signalled(agent, which):
    pid = {"pid 1": 1, "the console": os.getpid(), "its parent": os.getppid()}[which]
    command = overdue_pause(agent, pid)
    outcome = stop_hung_job(command.pk, grace_seconds=0.2)
    assert not outcome.stopped and outcome.detail.startswith("refused: ")
    assert "console's own processes" in outcome.detail or "PID 1" in outcome.detail
