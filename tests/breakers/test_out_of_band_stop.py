"""A hung job that never acknowledges is stopped from the outside by the local executor."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import timedelta

import pytest
from django.utils import timezone

from breakers.control.commands import expire_overdue_commands, issue_command, stop_hung_job
from breakers.executors.local import process_is_running
from breakers.models import Command, CommandStatus
from incidents.jobs import record_heartbeat
from incidents.models import Job, JobStatus

pytestmark = pytest.mark.django_db

# A "training process" that hangs: it never steps, never acknowledges.
HUNG = "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.05)\n"
# One that also ignores SIGTERM, as a process stuck in a collective sometimes does.
HUNG_DEAF = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + HUNG


@pytest.fixture
def hung_process():
    processes = []

    def start(script: str) -> subprocess.Popen:
        process = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True
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
