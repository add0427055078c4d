"""Per-rank heartbeat deadlines, through real HTTP heartbeats: one silent rank among
heartbeating ones is named by the watchdog; a paused job whose ranks fall silent alerts too."""

from __future__ import annotations

import pytest
import time_machine
from django.utils import timezone

from breakers.control.heartbeats import check_heartbeats
from breakers.models import Command
from incidents.models import Alert, Job, JobStatus

URL = "/api/v1/agent/heartbeat"
pytestmark = pytest.mark.django_db


@pytest.fixture
def two_ranks(agent, agent_post):
    """Two ranks heartbeating every 5 s at 1 s per step: each deadline is the 10 s floor."""

    def beat(rank, step, status="running"):
        body = {"step": step, "status": status, "rank": rank, "world_size": 2}
        body |= {"pid": 2000 + rank, "hostname": f"node-{rank}"}
        response = agent_post(URL, body)
        assert response.status_code == 200, response.content

    with time_machine.travel(timezone.now(), tick=False) as clock:
        for step in (0, 5, 10):
            beat(0, step)
            beat(1, step)
            clock.shift(5)
        yield agent, clock, beat


def test_a_silent_rank_alerts_while_the_other_heartbeats_and_is_named(two_ranks):
    agent, clock, beat = two_ranks
    # Rank 0 goes on (its beats used to reset the job's one deadline); rank 1 is silent.
    for step in (15, 20):
        assert check_heartbeats() == []
        beat(0, step)
        clock.shift(5)
    beat(0, 25)
    raised = check_heartbeats()  # 15 s after rank 1's last beat, its deadline 10 s
    assert len(raised) == 1 and check_heartbeats() == []
    alert = Alert.objects.get(pk=raised[0])
    assert "rank 1 (node-1, pid 2001)" in alert.description
    assert "1 other rank(s) still heartbeating" in alert.description
    assert alert.nodes == ["node-1"] and alert.step == 10
    assert alert.value == pytest.approx(15.0) and alert.threshold == pytest.approx(10.0)
    assert Command.objects.get(job_id=agent.job_id).kind == "checkpoint_and_pause"
    # Rank 0's heartbeats do not end the silence: rank 1 is still silent.
    beat(0, 30)
    assert Alert.objects.get(pk=alert.pk).status == "firing"
    assert Job.objects.get(pk=agent.job_id).heartbeat_overdue_since is not None
    beat(1, 30)  # rank 1 is back
    assert Alert.objects.get(pk=alert.pk).status == "resolved"
    assert Job.objects.get(pk=agent.job_id).heartbeat_overdue_since is None


def test_both_ranks_beating_never_alerts(two_ranks):
    _, clock, beat = two_ranks
    for step in range(15, 100, 5):
        beat(0, step)
        beat(1, step)
        clock.shift(5)
        assert check_heartbeats() == []


def test_a_paused_job_whose_rank_stops_heartbeating_alerts_without_pausing_again(two_ranks):
    agent, clock, beat = two_ranks
    Job.objects.filter(pk=agent.job_id).update(status=JobStatus.PAUSED)
    for _ in range(4):  # both hold, heartbeating as paused: watched, and quiet
        beat(0, 10, "paused")
        beat(1, 10, "paused")
        clock.shift(5)
        assert check_heartbeats() == []
    for _ in range(3):  # rank 0 died while holding; rank 1 goes on saying "paused"
        beat(1, 10, "paused")
        clock.shift(5)
    raised = check_heartbeats()
    assert len(raised) == 1
    alert = Alert.objects.get(pk=raised[0])
    assert alert.severity == "L3" and "rank 0 (node-0, pid 2000)" in alert.description
    assert "while paused" in alert.description and alert.action == "none"
    assert not Command.objects.filter(job_id=agent.job_id).exists()
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


def test_a_paused_job_gone_silent_altogether_alerts(two_ranks):
    agent, clock, _ = two_ranks
    Job.objects.filter(pk=agent.job_id).update(status=JobStatus.PAUSED)
    clock.shift(60)
    (raised,) = check_heartbeats()
    description = Alert.objects.get(pk=raised).description
    assert "rank 0 (node-0" in description and "rank 1 (node-1" in description


def test_silent_ranks_at_different_steps_name_the_one_behind(two_ranks):
    agent, clock, beat = two_ranks
    beat(0, 11)  # rank 0 got one step further, then both hung (rank 1 inside step 11)
    clock.shift(60)
    (raised,) = check_heartbeats()
    description = Alert.objects.get(pk=raised).description
    assert "behind at step 10: rank(s) 1 (the others wait for them)" in description
