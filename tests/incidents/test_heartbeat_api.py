"""POST /api/v1/agent/heartbeat: liveness, step time, deadline; bad heartbeats change nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.utils import timezone

from incidents.heartbeats import record_heartbeat
from incidents.models import Job, JobStatus

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

URL = "/api/v1/agent/heartbeat"
pytestmark = pytest.mark.django_db


def test_a_heartbeat_marks_the_job_alive_and_answers_commands(agent, agent_post):
    response = agent_post(URL, {"step": 120, "status": "running", "pid": 4242, "hostname": "gpu-1"})
    assert response.status_code == 200, response.content
    assert response.json() == {"commands": []}
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.RUNNING and job.agent_status == "running"
    assert job.current_step == 120 and job.agent_pid == 4242 and job.agent_hostname == "gpu-1"
    assert job.heartbeat_deadline == job.last_heartbeat_at + timedelta(
        seconds=settings.HEARTBEAT_TIMEOUT_DEFAULT_SECONDS
    )


def test_step_time_is_measured_and_sets_the_deadline(agent):
    start = timezone.now()
    with time_machine.travel(start, tick=False) as traveller:
        record_heartbeat(agent.job_id, step=100, status="running")
        traveller.shift(10)  # 100 steps in 10 s: 0.1 s per step
        job = record_heartbeat(agent.job_id, step=200, status="running")
    assert job.step_time_seconds == pytest.approx(0.1)
    # 8 x 0.1 s = 0.8 s is below the floor, so the floor applies.
    assert (job.heartbeat_deadline - job.last_heartbeat_at).total_seconds() == pytest.approx(
        settings.HEARTBEAT_TIMEOUT_FLOOR_SECONDS
    )


def test_slow_steps_give_eight_step_times(agent):
    start = timezone.now()
    with time_machine.travel(start, tick=False) as traveller:
        record_heartbeat(agent.job_id, step=0, status="running")
        traveller.shift(30)  # 10 steps in 30 s
        job = record_heartbeat(agent.job_id, step=10, status="running")
    assert (job.heartbeat_deadline - job.last_heartbeat_at).total_seconds() == pytest.approx(24.0)


def test_the_jobs_own_timeout_wins(agent):
    Job.objects.filter(pk=agent.job_id).update(heartbeat_timeout_seconds=300)
    job = record_heartbeat(agent.job_id, step=1, status="running")
    assert (job.heartbeat_deadline - job.last_heartbeat_at).total_seconds() == 300


def test_finished_ends_the_job_and_clears_the_deadline(agent, agent_post):
    agent_post(URL, {"step": 5, "status": "running"})
    agent_post(URL, {"step": 9, "status": "finished"})
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.FINISHED and job.heartbeat_deadline is None


@pytest.mark.parametrize(
    "body, field",
    [
        ({"status": "running"}, "step"),
        ({"step": 1}, "status"),
        ({"step": -1, "status": "running"}, "step"),
        ({"step": "1", "status": "running"}, "step"),
        ({"step": 1, "status": "sleeping"}, "status"),
        ({"step": 1, "status": "running", "pid": -5}, "pid"),
        ({"step": 1, "status": "running", "pid": "12"}, "pid"),
        ({"step": 1, "status": "running", "rank": -1}, "rank"),
        ({"step": 1, "status": "running", "hostname": 5}, "hostname"),
        ({"step": 1, "status": "running", "mood": "ok"}, "mood"),
    ],
)
def test_bad_heartbeats_are_400_and_change_nothing(agent, agent_post, body, field):
    response = agent_post(URL, body)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid" and field in response.json()["fields"]
    job = Job.objects.get(pk=agent.job_id)
    assert job.last_heartbeat_at is None and job.status == JobStatus.PENDING


def test_malformed_heartbeat_json_is_400(agent, agent_post):
    response = agent_post(URL, b"{")
    assert response.status_code == 400 and response.json()["error"] == "malformed_json"


def test_heartbeat_without_token_is_401(client, agent):
    response = client.post(
        URL, data={"step": 1, "status": "running"}, content_type="application/json"
    )
    assert response.status_code == 401


def test_finished_after_a_delivered_terminate_is_terminated(agent, agent_post):
    """The process's last beat overtook its terminate's acknowledgement (seen under load in
    the drill set): the job stopped by the terminate reads terminated, not finished, and the
    late acknowledgement is still taken."""
    from breakers.control.commands import issue_command

    agent_post(URL, {"step": 5, "status": "running"})
    command = issue_command(agent.job_id, "terminate", reason="L4").command
    replied = agent_post(URL, {"step": 6, "status": "running"}).json()["commands"]
    assert [c["id"] for c in replied] == [command.pk]  # delivered in the reply
    agent_post(URL, {"step": 6, "status": "finished"})
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.TERMINATED
    late = agent_post(
        f"/api/v1/agent/commands/{command.pk}/ack",
        {"status": "succeeded", "result": {"step": 6, "exit_code": 75}},
    )
    assert late.status_code == 200, late.content
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.TERMINATED


def test_finished_with_a_terminate_never_delivered_is_finished(agent, agent_post):
    from breakers.control.commands import issue_command

    agent_post(URL, {"step": 5, "status": "running"})
    issue_command(agent.job_id, "terminate", reason="L4")  # still pending: never reached it
    agent_post(URL, {"step": 9, "status": "finished"})
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.FINISHED
