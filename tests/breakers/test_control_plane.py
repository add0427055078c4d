"""Commands: issued once per key, returned in replies until acknowledged, job status follows."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from breakers.control.commands import issue_command
from breakers.models import Command, CommandStatus
from core.errors import Conflict, InvalidInput
from incidents.models import Job, JobStatus

pytestmark = pytest.mark.django_db

HEARTBEAT = "/api/v1/agent/heartbeat"
METRICS = "/api/v1/agent/metrics"


def ack_url(command_id: int) -> str:
    return f"/api/v1/agent/commands/{command_id}/ack"


def running(agent, agent_post) -> None:
    agent_post(HEARTBEAT, {"step": 10, "status": "running"})
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.RUNNING


def test_the_same_idempotency_key_is_the_same_command(agent):
    first = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN", idempotency_key="a:1")
    again = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN", idempotency_key="a:1")
    assert first.created and not again.created
    assert first.command.pk == again.command.pk
    assert Command.objects.count() == 1


@pytest.mark.parametrize(
    "kind, reason, field", [("reboot", "why", "kind"), ("terminate", "  ", "reason")]
)
def test_bad_commands_are_refused(agent, kind, reason, field):
    with pytest.raises(InvalidInput) as refused:
        issue_command(agent.job_id, kind, reason=reason)
    assert field in refused.value.fields
    assert not Command.objects.exists()


def test_a_terminated_job_takes_no_commands(agent):
    Job.objects.filter(pk=agent.job_id).update(status=JobStatus.TERMINATED)
    with pytest.raises(Conflict):
        issue_command(agent.job_id, "resume", reason="try")


def test_pending_commands_ride_on_heartbeat_and_metrics_replies_until_acked(agent, agent_post):
    running(agent, agent_post)
    command = issue_command(
        agent.job_id,
        "lower_lr",
        reason="loss 4σ for 10 min",
        params={"factor": 0.5},
        severity="L2",
    ).command
    reply = agent_post(HEARTBEAT, {"step": 11, "status": "running"}).json()
    assert reply["commands"] == [
        {
            "id": command.pk,
            "kind": "lower_lr",
            "params": {"factor": 0.5},
            "severity": "L2",
            "reason": "loss 4σ for 10 min",
            "issued_at": command.issued_at.isoformat().replace("+00:00", "Z"),
            "apply_at_step": None,  # one process: the first boundary after it arrives
        }
    ]
    command.refresh_from_db()
    assert command.status == CommandStatus.DELIVERED and command.delivered_at is not None
    # Not acknowledged yet: it comes again, in the metrics reply too.
    reply = agent_post(METRICS, {"points": [{"name": "loss", "step": 11, "value": 1.0}]}).json()
    assert [c["id"] for c in reply["commands"]] == [command.pk]
    ack = agent_post(ack_url(command.pk), {"status": "succeeded", "result": {"lr": [1.5e-4]}})
    assert ack.status_code == 200 and ack.json() == {"id": command.pk, "status": "succeeded"}
    assert agent_post(HEARTBEAT, {"step": 12, "status": "running"}).json()["commands"] == []


def test_checkpoint_and_pause_pauses_only_once_the_checkpoint_is_confirmed(agent, agent_post):
    running(agent, agent_post)
    command = issue_command(
        agent.job_id, "checkpoint_and_pause", reason="NaN", severity="L3"
    ).command
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSING
    result = {
        "path": "/ckpt/step-12.pt",
        "bytes": 1234,
        "seconds": 0.4,
        "sha256": "ab" * 32,
        "step": 12,
    }
    agent_post(ack_url(command.pk), {"status": "succeeded", "result": result})
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED
    command.refresh_from_db()
    assert command.result == result and command.acknowledged_at is not None
    resume = issue_command(agent.job_id, "resume", reason="false alarm").command
    agent_post(ack_url(resume.pk), {"status": "succeeded"})
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.RUNNING


def test_a_failed_checkpoint_does_not_count_as_paused(agent, agent_post):
    running(agent, agent_post)
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN").command
    agent_post(ack_url(command.pk), {"status": "failed", "error": "disk full"})
    command.refresh_from_db()
    assert command.status == CommandStatus.FAILED and command.error == "disk full"
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSING


def test_terminate_ends_the_job(agent, agent_post):
    running(agent, agent_post)
    command = issue_command(agent.job_id, "terminate", reason="XID 79", severity="L4").command
    agent_post(ack_url(command.pk), {"status": "succeeded"})
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.TERMINATED and job.heartbeat_deadline is None


def test_acknowledging_twice_or_late_changes_nothing(agent, agent_post):
    running(agent, agent_post)
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN").command
    agent_post(ack_url(command.pk), {"status": "succeeded", "result": {"path": "/a"}})
    again = agent_post(ack_url(command.pk), {"status": "failed", "error": "late"})
    assert again.status_code == 200 and again.json()["status"] == "succeeded"
    command.refresh_from_db()
    assert command.result == {"path": "/a"} and command.error == ""
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


def test_another_jobs_command_is_404(make_agent, client):
    mine, other = make_agent(name="mine"), make_agent(name="other")
    command = issue_command(other.job_id, "terminate", reason="x").command
    response = client.post(
        ack_url(command.pk),
        data={"status": "succeeded"},
        content_type="application/json",
        headers=mine.headers,
    )
    assert response.status_code == 404 and response.json()["error"] == "not_found"
    command.refresh_from_db()
    assert command.status == CommandStatus.PENDING


@pytest.mark.parametrize(
    "body, field",
    [
        ({}, "status"),
        ({"status": "done"}, "status"),
        ({"status": "failed", "result": [1]}, "result"),
        ({"status": "failed", "error": 5}, "error"),
        ({"status": "failed", "extra": 1}, "extra"),
    ],
)
def test_bad_acknowledgements_are_400_and_change_nothing(agent, agent_post, body, field):
    command = issue_command(agent.job_id, "terminate", reason="x").command
    response = agent_post(ack_url(command.pk), body)
    assert response.status_code == 400 and field in response.json()["fields"]
    command.refresh_from_db()
    assert command.status == CommandStatus.PENDING


@pytest.mark.django_db(transaction=True)
def test_two_workers_issuing_the_same_key_make_one_command(agent):
    barrier = threading.Barrier(2)
    created = []

    def issue() -> None:
        barrier.wait()
        try:
            created.append(
                issue_command(
                    agent.job_id, "checkpoint_and_pause", reason="NaN", idempotency_key="alert:7"
                ).created
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=issue) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(created) == [False, True]
    assert Command.objects.filter(job_id=agent.job_id).count() == 1


def test_an_acknowledged_isolation_marks_the_node_isolated(agent, agent_post):
    from incidents.models import Node

    agent_post(
        METRICS,
        {
            "points": [
                {"name": "loss", "step": 1, "value": 1.0, "node": "node-07"},
                {"name": "loss", "step": 1, "value": 1.0, "node": "node-08"},
            ]
        },
    )
    command = issue_command(
        agent.job_id, "isolate_node", reason="XID 79", params={"node": "node-07"}
    ).command
    assert Node.objects.get(hostname="node-07").status == "healthy"
    agent_post(ack_url(command.pk), {"status": "succeeded"})
    statuses = dict(Node.objects.filter(job_id=agent.job_id).values_list("hostname", "status"))
    assert statuses == {"node-07": "isolated", "node-08": "healthy"}
