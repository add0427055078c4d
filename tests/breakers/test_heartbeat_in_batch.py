"""A rank's heartbeat riding inside its metrics batch (protocol 3): recorded with the batch
in one transaction, validated as strictly as a heartbeat of its own, nothing half-written."""

from __future__ import annotations

import pytest

from breakers.storage.points import stored_points
from incidents.models import Job, JobRank

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

URL = "/api/v1/agent/metrics"
pytestmark = pytest.mark.django_db


def beat(**overrides):
    return {"step": 7, "status": "running", "pid": 4242, "hostname": "gpu-1", **overrides}


def batch(heartbeat, rank=3, **extra):
    body = {"rank": rank, "points": [{"name": "loss", "step": 7, "value": "NaN"}], **extra}
    return body | ({"heartbeat": heartbeat} if heartbeat is not ... else {})


def ranks(job_id):
    return {r.rank: (r.step, r.status) for r in JobRank.objects.filter(job_id=job_id)}


def test_the_heartbeat_is_recorded_for_the_batchs_rank_with_its_points(agent, agent_post):
    response = agent_post(URL, batch(beat(status="holding", world_size=4)))
    assert response.status_code == 202, response.json()
    assert response.headers["Brakeline-Protocol"] == "4"
    assert ranks(agent.job_id) == {3: (7, "holding")}
    assert len(stored_points(agent.job_id)) == 1
    assert Job.objects.get(pk=agent.job_id).world_size == 4


def test_a_batch_without_points_may_carry_only_a_heartbeat(agent, agent_post):
    response = agent_post(URL, {"rank": 1, "points": [], "heartbeat": beat(rank=1)})
    assert response.status_code == 202
    assert ranks(agent.job_id) == {1: (7, "running")}


@pytest.mark.parametrize(
    ("heartbeat", "field"),
    [
        (beat(status="sleeping"), "heartbeat.status"),
        ({"status": "running"}, "heartbeat.step"),
        (beat(step=-1), "heartbeat.step"),
        (beat(step=True), "heartbeat.step"),
        (beat(colour="red"), "heartbeat.colour"),
        (beat(hostname="gpu[1-2]"), "heartbeat.hostname"),
        (beat(hostname="a\u0000b"), "heartbeat.hostname"),
        (beat(rank=2), "heartbeat.rank"),  # another rank's heartbeat
        (beat(world_size=3), "heartbeat.world_size"),  # not above the rank (3)
        (beat(launcher_pid=77), "heartbeat.launcher_pgid"),
        ([1, 2], "heartbeat"),
        ("running", "heartbeat"),
    ],
)
def test_a_bad_heartbeat_refuses_the_whole_batch_naming_its_field(
    agent, agent_post, heartbeat, field
):
    response = agent_post(URL, batch(heartbeat))
    assert response.status_code == 400
    assert field in response.json()["fields"], response.json()
    assert not stored_points(agent.job_id)
    assert ranks(agent.job_id) == {}


def test_a_bad_point_refuses_the_heartbeat_riding_with_it(agent, agent_post):
    body = batch(beat())
    body["points"].append({"name": "loss", "step": -1, "value": 1.0})
    response = agent_post(URL, body)
    assert response.status_code == 400
    assert "points[1].step" in response.json()["fields"]
    assert ranks(agent.job_id) == {}


def test_a_retried_batch_records_neither_its_points_nor_its_heartbeat_again(agent, agent_post):
    first = agent_post(URL, batch(beat(step=7), batch="run-1"))
    again = agent_post(URL, batch(beat(step=9, status="paused"), batch="run-1"))
    assert (first.status_code, again.status_code) == (202, 202)
    assert ranks(agent.job_id) == {3: (7, "running")}
    assert len(stored_points(agent.job_id)) == 1


def test_a_null_heartbeat_is_none(agent, agent_post):
    response = agent_post(URL, batch(None))
    assert response.status_code == 202
    assert ranks(agent.job_id) == {}


def test_a_null_rank_in_the_heartbeat_is_the_batchs(agent, agent_post):
    assert agent_post(URL, batch(beat(rank=None))).status_code == 202
    assert ranks(agent.job_id) == {3: (7, "running")}


def test_the_reply_carries_the_commands_of_a_heartbeat_only_batchs_rank(agent, agent_post):
    from breakers.control.commands import issue_command

    agent_post("/api/v1/agent/heartbeat", beat(rank=0, world_size=2))
    issue_command(agent.job_id, "checkpoint_and_pause", reason="test")
    response = agent_post(URL, {"rank": 1, "points": [], "heartbeat": beat(rank=1)})
    assert [c["kind"] for c in response.json()["commands"]] == ["checkpoint_and_pause"]


def test_a_new_run_under_a_finished_jobs_token_is_refused_whole(agent, agent_post):
    agent_post("/api/v1/agent/heartbeat", beat(rank=0, pid=100))
    Job.objects.filter(pk=agent.job_id).update(status="finished")
    response = agent_post(URL, batch(beat(pid=200), rank=0))
    assert response.status_code == 409
    assert response.json()["error"] == "job_over"
    assert not stored_points(agent.job_id)
