"""Legal but extreme reports must not stop a brake, the watchdog or the console.

Found by a hostile-input sweep: a point at step 2⁶³−1 (a legal step) made every brake of a
multi-rank job fail (its apply step overflowed the bigint column), and the failure then left
the watchdog tick before any command of any job expired; an acknowledgement's ``result.step``
that is no step answered 500 while an incident was open; a rank far above the job's world
size, or a world of 2³¹−1 ranks, was tallied by listing every rank (seconds of one thread and
gigabytes of memory per acknowledgement).
"""

from __future__ import annotations

from datetime import timedelta

import kombu.exceptions
import pytest
import redis.exceptions
import time_machine
from django.utils import timezone

from breakers.agent.points import MAX_STEP
from breakers.control.acks import RULE_KEY as SPLIT_RULE
from breakers.control.acks import flag_split_commands
from breakers.control.commands import issue_command
from breakers.control.watchdog import watchdog_tick
from breakers.detection.evaluation import BREAKERS_FAILING_RULE
from breakers.models import Command, CommandAck, CommandStatus
from incidents.heartbeats import HEARTBEAT_RULE_KEY
from incidents.models import Alert, Job, JobRank, JobStatus, TimelineEntry
from tests.support.authz import raise_alert

pytestmark = pytest.mark.django_db

HEARTBEAT = "/api/v1/agent/heartbeat"
METRICS = "/api/v1/agent/metrics"


def ack_path(command_id: int) -> str:
    return f"/api/v1/agent/commands/{command_id}/ack"


def two_ranks(agent_post, step: int = 5, world_size: int = 2) -> None:
    for rank in (0, 1):
        body = {"step": step, "status": "running", "rank": rank, "world_size": world_size}
        assert agent_post(HEARTBEAT, body).status_code == 200


def at_the_last_step(agent_post) -> None:
    two_ranks(agent_post)
    point = {"name": "loss", "step": MAX_STEP, "value": "NaN"}
    assert agent_post(METRICS, {"points": [point]}).status_code == 202


def overdue(job_id: int, deadline) -> None:
    """The job's ranks (and so the job) past their deadline, as silence leaves them."""
    Job.objects.filter(pk=job_id).update(heartbeat_deadline=deadline)
    JobRank.objects.filter(job_id=job_id).update(heartbeat_deadline=deadline)


def test_a_job_at_the_last_step_is_still_braked_by_a_person(agent, agent_post):
    at_the_last_step(agent_post)
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN").command
    assert command.apply_at_step == MAX_STEP
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSING
    # ... and both ranks acknowledging there pause it.
    for rank in (0, 1):
        result = {"step": MAX_STEP, "rank": rank}
        response = agent_post(ack_path(command.pk), {"status": "succeeded", "result": result})
        assert response.status_code == 200, response.content
    assert Command.objects.get(pk=command.pk).status == CommandStatus.SUCCEEDED
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


def test_one_jobs_failing_heartbeat_check_leaves_the_others_judged(
    agent, agent_post, make_agent, client, monkeypatch
):
    other = make_agent()
    for token in (agent.token, other.token):
        response = client.post(
            HEARTBEAT,
            data={"step": 1, "status": "running"},
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 200
    past = timezone.now() - timedelta(seconds=5)
    overdue(agent.job_id, past - timedelta(seconds=1))
    overdue(other.job_id, past)
    # Whatever breaks one job's check (the overflow above was one such thing): here its
    # signal, for the first job only.
    from breakers.control import heartbeats

    real = heartbeats.heartbeat_signal

    def failing(job, now):
        if job.pk == agent.job_id:
            raise ValueError("a report nobody foresaw")
        return real(job, now)

    monkeypatch.setattr(heartbeats, "heartbeat_signal", failing)
    watchdog_tick(stop_job=lambda command_id: None)
    assert Alert.objects.filter(job_id=other.job_id, rule_key=HEARTBEAT_RULE_KEY).exists()
    failing_alert = Alert.objects.get(job_id=agent.job_id, rule_key=BREAKERS_FAILING_RULE)
    assert "a report nobody foresaw" in failing_alert.description
    assert not Alert.objects.filter(job_id=agent.job_id, rule_key=HEARTBEAT_RULE_KEY).exists()


@pytest.mark.parametrize(
    "outage",
    [
        kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379."),
        redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379."),
    ],
    ids=["broker", "redis"],
)
def test_an_outage_of_the_consoles_redis_is_retried_not_blamed_on_the_job(
    agent, agent_post, monkeypatch, outage
):
    """Seen in the fault suite: Redis restarted while a silence was judged made that job's L3
    "breakers failing" alert (paged, and counted as an alert nobody provoked)."""
    assert agent_post(HEARTBEAT, {"step": 1, "status": "running"}).status_code == 200
    overdue(agent.job_id, timezone.now() - timedelta(seconds=5))
    from breakers.control import heartbeats

    def down(job, now):
        raise outage

    monkeypatch.setattr(heartbeats, "heartbeat_signal", down)
    with pytest.raises(type(outage)):
        heartbeats.check_heartbeats()
    assert not Alert.objects.filter(job_id=agent.job_id, rule_key=BREAKERS_FAILING_RULE).exists()
    monkeypatch.undo()  # Redis is back: the next tick judges the silence
    assert len(heartbeats.check_heartbeats()) == 1


def test_a_failing_watchdog_duty_still_lets_overdue_commands_expire(agent, monkeypatch):
    from breakers.control import watchdog

    def broken(*args, **kwargs):
        raise ValueError("one duty broke")

    monkeypatch.setattr(watchdog, "check_heartbeats", broken)
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN").command
    stopped: list[int] = []
    later = time_machine.travel(timezone.now() + timedelta(hours=2), tick=False)
    # The tick still shows as failed, once every duty has run.
    with later, pytest.raises(ValueError, match="one duty broke"):
        watchdog.watchdog_tick(stop_job=stopped.append)
    assert Command.objects.get(pk=command.pk).status == CommandStatus.EXPIRED


@pytest.mark.parametrize("key", ["step", "restored_step", "weights_step", "apply_at_step"])
@pytest.mark.parametrize("value", ["abc", 2**70, -1, [1], True, 1.5])
def test_a_result_step_that_is_no_step_is_refused_naming_it(agent, agent_post, key, value):
    alert = raise_alert(agent.job_id, "L3")  # an open incident: acks are written to it
    command = issue_command(
        agent.job_id, "checkpoint_and_pause", reason="brake", alert_id=alert.pk
    ).command
    rows = TimelineEntry.objects.count()
    response = agent_post(ack_path(command.pk), {"status": "succeeded", "result": {key: value}})
    assert response.status_code == 400, response.content
    assert f"result.{key}" in response.json()["fields"]
    assert Command.objects.get(pk=command.pk).status != CommandStatus.SUCCEEDED
    assert TimelineEntry.objects.count() == rows


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"status": "succeeded", "result": 0}, "result"),
        ({"status": "succeeded", "result": False}, "result"),
        ({"status": "failed", "error": 0}, "error"),
        ({"status": "failed", "error": []}, "error"),
    ],
)
def test_a_falsy_value_of_the_wrong_type_is_no_absent_field(agent, agent_post, body, field):
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="brake").command
    response = agent_post(ack_path(command.pk), body)
    assert response.status_code == 400 and field in response.json()["fields"]


@pytest.mark.parametrize(
    ("field", "value"), [("hostname", False), ("hostname", 0), ("slurm_nodelist", 0)]
)
def test_a_heartbeats_falsy_value_of_the_wrong_type_is_refused(agent_post, field, value):
    response = agent_post(HEARTBEAT, {"step": 1, "status": "running", field: value})
    assert response.status_code == 400 and field in response.json()["fields"]


def test_an_ack_from_a_rank_the_job_does_not_have_is_refused(agent, agent_post):
    two_ranks(agent_post)
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="brake").command
    result = {"rank": 20_000_000, "step": 30}
    response = agent_post(ack_path(command.pk), {"status": "succeeded", "result": result})
    assert response.status_code == 400
    assert "world size (2)" in response.json()["fields"]["result.rank"]
    assert not CommandAck.objects.exists()


def test_a_world_of_two_billion_ranks_is_counted_not_listed(agent, agent_post, settings):
    settings.COMMAND_SPLIT_SECONDS = 30.0
    with time_machine.travel(timezone.now(), tick=False) as clock:
        two_ranks(agent_post, world_size=2**31 - 1)
        command = issue_command(agent.job_id, "checkpoint_and_pause", reason="brake").command
        for rank in (0, 1):
            result = {"rank": rank, "step": command.apply_at_step}
            response = agent_post(ack_path(command.pk), {"status": "succeeded", "result": result})
            assert response.json()["status"] in ("pending", "delivered")  # still open
        clock.shift(31)
        assert flag_split_commands() == 1
    alert = Alert.objects.get(job_id=agent.job_id, rule_key=SPLIT_RULE)
    assert "acknowledged by ranks 0, 1, not by ranks 2, 3," in alert.description
    assert f"and {2**31 - 3 - 16} more" in alert.description
    assert alert.value == 2**31 - 3
