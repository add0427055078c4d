"""Multi-rank jobs through POST /api/v1/agent/heartbeat: one row per rank, the world size,
rank 0's pid and host on the job, and "finished" only when every rank has finished."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.utils import timezone

from incidents.models import Job, JobRank, JobStatus

URL = "/api/v1/agent/heartbeat"
pytestmark = pytest.mark.django_db


def beat(agent_post, rank, step, status="running", **extra):
    body = {"step": step, "status": status, "rank": rank, "pid": 1000 + rank}
    body |= {"hostname": f"gpu-{rank}", "world_size": 2} | extra
    response = agent_post(URL, body)
    assert response.status_code == 200, response.content
    return response


def test_each_rank_has_its_own_row_and_rank_0_owns_the_job_fields(agent, agent_post):
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        beat(agent_post, 0, 0)
        beat(agent_post, 1, 0)
        clock.shift(10)
        beat(agent_post, 1, 50)  # rank 1: 0.2 s per step, heartbeating last
        beat(agent_post, 0, 100)  # rank 0: 0.1 s per step
        clock.shift(1)
        beat(agent_post, 1, 55, hostname="gpu-9", pid=4444)
    job = Job.objects.get(pk=agent.job_id)
    ranks = {r.rank: r for r in JobRank.objects.filter(job=job)}
    assert job.world_size == 2 and set(ranks) == {0, 1}
    # The last heartbeat came from rank 1; the job's process is still rank 0's.
    assert (job.agent_pid, job.agent_hostname) == (1000, "gpu-0")
    assert job.step_time_seconds == pytest.approx(0.1)
    assert ranks[0].step_time_seconds == pytest.approx(0.1)
    assert (ranks[1].pid, ranks[1].hostname, ranks[1].step) == (4444, "gpu-9", 55)
    assert ranks[1].step_time_seconds == pytest.approx(0.8 * 0.2 + 0.2 * 0.2)
    # The job's deadline is the earliest rank deadline: rank 0's, 10 s (floor) after its beat.
    assert job.heartbeat_deadline == ranks[0].heartbeat_deadline
    assert job.heartbeat_deadline == start + timedelta(
        seconds=10 + settings.HEARTBEAT_TIMEOUT_FLOOR_SECONDS
    )


def test_a_heartbeat_without_rank_is_rank_0(agent, agent_post):
    agent_post(URL, {"step": 3, "status": "running", "pid": 77, "hostname": "solo"})
    (only,) = JobRank.objects.filter(job_id=agent.job_id)
    assert (only.rank, only.pid, only.hostname, only.step) == (0, 77, "solo", 3)
    assert Job.objects.get(pk=agent.job_id).world_size is None


def test_the_job_finishes_only_when_every_rank_has(agent, agent_post):
    beat(agent_post, 0, 5)
    beat(agent_post, 1, 5)
    beat(agent_post, 0, 9, "finished")
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.RUNNING and job.heartbeat_deadline is not None
    # Rank 0 finished, so the job's deadline is rank 1's alone.
    assert job.heartbeat_deadline == JobRank.objects.get(job=job, rank=1).heartbeat_deadline
    beat(agent_post, 1, 9, "finished")
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.FINISHED and job.heartbeat_deadline is None


def test_a_known_world_size_waits_for_ranks_that_never_spoke(agent, agent_post):
    beat(agent_post, 0, 9, "finished", world_size=3)
    beat(agent_post, 1, 9, "finished", world_size=3)
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.RUNNING
    beat(agent_post, 2, 9, "finished", world_size=3)
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.FINISHED


def test_a_smaller_restart_forgets_the_ranks_beyond_its_world_size(agent, agent_post):
    for rank in range(3):
        beat(agent_post, rank, 1, world_size=3)
    beat(agent_post, 0, 2, world_size=2)
    assert sorted(JobRank.objects.values_list("rank", flat=True)) == [0, 1]


@pytest.mark.parametrize(
    "extra, field",
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": -2}, "world_size"),
        ({"world_size": "2"}, "world_size"),
        ({"world_size": 2.5}, "world_size"),
        ({"world_size": True}, "world_size"),
        ({"world_size": 2**31}, "world_size"),
        ({"world_size": 2, "rank": 2}, "world_size"),
    ],
)
def test_a_bad_world_size_is_a_400_naming_it_and_changes_nothing(agent, agent_post, extra, field):
    response = agent_post(URL, {"step": 1, "status": "running"} | extra)
    assert response.status_code == 400, response.content
    assert response.json()["fields"].keys() == {field}
    assert not JobRank.objects.exists()
    assert Job.objects.get(pk=agent.job_id).last_heartbeat_at is None


def test_world_size_of_one_without_rank_is_accepted(agent, agent_post):
    assert agent_post(URL, {"step": 1, "status": "running", "world_size": 1}).status_code == 200


def test_the_jobs_api_shows_the_world_size(agent, agent_post, client):
    from django.contrib.auth import get_user_model

    from incidents.models import Membership, Role

    beat(agent_post, 1, 4, world_size=8)
    user = get_user_model().objects.create_user("vera", password="pw-for-tests")
    Membership.objects.create(
        user=user, team=Job.objects.get(pk=agent.job_id).team, role=Role.VIEWER
    )
    client.force_login(user)
    assert client.get(f"/api/v1/jobs/{agent.job_id}").json()["world_size"] == 8


def test_until_rank_0_speaks_the_job_fields_are_the_reporting_ranks(agent, agent_post):
    beat(agent_post, 3, 7, world_size=4)  # a lone process that inherited RANK=3
    job = Job.objects.get(pk=agent.job_id)
    assert (job.agent_pid, job.agent_hostname, job.last_heartbeat_step) == (1003, "gpu-3", 7)
    beat(agent_post, 0, 8, world_size=4)
    beat(agent_post, 3, 9, world_size=4)
    job = Job.objects.get(pk=agent.job_id)
    assert (job.agent_pid, job.agent_hostname, job.last_heartbeat_step) == (1000, "gpu-0", 8)
