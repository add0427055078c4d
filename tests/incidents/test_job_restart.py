"""A job restarted outside the console is braked again; a finished job's token does not start
a run nobody can brake.

Found by a new user: a process started again with the token of a paused job trained to the end
with a NaN (every automatic pause was refused, "already paused"), and the same with the token
of a finished job. A new process (a pid the rank did not have) heartbeating "running" on a
paused job moves it to running — the "restart" event — written on its open incident; on a
finished or terminated job it is refused with 409 before anything is written.
"""

from __future__ import annotations

import pytest

from breakers.control.commands import issue_command
from core.errors import Conflict
from incidents.models import Job, JobStatus, TimelineEntry, TimelineKind
from tests.support.authz import raise_alert

URL = "/api/v1/agent/heartbeat"
pytestmark = pytest.mark.django_db


def beat(agent_post, pid: int, status: str = "running", step: int = 50):
    return agent_post(URL, {"step": step, "status": status, "pid": pid, "hostname": "gpu-1"})


def paused(agent, agent_post, pid: int = 100) -> int:
    """The job braked by an L3 and paused by its process ``pid``; the incident's id."""
    assert beat(agent_post, pid, step=40).status_code == 200
    alert = raise_alert(agent.job_id, "L3")
    command = issue_command(
        agent.job_id, "checkpoint_and_pause", reason="NaN", alert_id=alert.pk
    ).command
    result = {"step": 50, "path": "/ckpt/50.pt"}
    ack = {"status": "succeeded", "result": result}
    assert agent_post(f"/api/v1/agent/commands/{command.pk}/ack", ack).status_code == 200
    assert beat(agent_post, pid, status="paused").status_code == 200
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED
    return alert.incident_id


def test_a_new_process_of_a_paused_job_makes_it_running_and_brakable(agent, agent_post):
    incident_id = paused(agent, agent_post)
    assert beat(agent_post, pid=200, step=51).status_code == 200
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.RUNNING
    row = TimelineEntry.objects.get(incident_id=incident_id, kind=TimelineKind.RESUMED)
    assert "restarted outside the console" in row.message and "pid 200" in row.message
    # Its breakers act again: a pause is taken, not refused as already done.
    assert issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN again").created


def test_the_paused_process_itself_saying_running_changes_nothing(agent, agent_post):
    # The paused process's own beats (a resume being applied before its ack) are no restart.
    paused(agent, agent_post)
    assert beat(agent_post, pid=100).status_code == 200
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


def test_a_paused_job_stays_paused_while_its_new_process_has_not_said_it_trains(agent, agent_post):
    paused(agent, agent_post)
    assert beat(agent_post, pid=200, status="paused").status_code == 200
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


@pytest.mark.parametrize("status", [JobStatus.FINISHED, JobStatus.TERMINATED])
def test_a_new_run_under_a_finished_jobs_token_is_refused(agent, agent_post, status):
    assert beat(agent_post, pid=100).status_code == 200
    Job.objects.filter(pk=agent.job_id).update(status=status)
    before = Job.objects.get(pk=agent.job_id).last_heartbeat_at
    response = beat(agent_post, pid=200, step=1)
    assert response.status_code == 409
    assert "a new run needs a job of its own" in response.json()["detail"]
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == status and job.last_heartbeat_at == before  # nothing written
    # The job's own process, late, still counts (its last beats may trail the end).
    assert beat(agent_post, pid=100, status="finished").status_code == 200


def test_a_person_cannot_pause_a_paused_job_but_can_once_it_restarted(agent, agent_post):
    paused(agent, agent_post)
    with pytest.raises(Conflict):
        issue_command(agent.job_id, "checkpoint_and_pause", reason="again")
    beat(agent_post, pid=300)
    assert issue_command(agent.job_id, "checkpoint_and_pause", reason="again").command.pk
