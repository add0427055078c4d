"""Per-rank acknowledgement through the real agent endpoints: a multi-rank job's command
carries apply_at_step, stays deliverable to every rank until each has acked, succeeds (and the
job pauses) only when all ranks acked the same step, and a split is an L3 alert naming the
ranks — at once for different steps, from the watchdog for a partial ack past its deadline."""

from __future__ import annotations

import pytest
import time_machine
from django.utils import timezone

from breakers.control.acks import RULE_KEY, flag_split_commands
from breakers.control.commands import issue_command
from breakers.control.unapplied import UNAPPLIED_STEPS, flag_unapplied_commands
from breakers.models import Command, CommandAck, CommandStatus
from incidents.models import Alert, Job, JobStatus

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

HEARTBEAT = "/api/v1/agent/heartbeat"
METRICS = "/api/v1/agent/metrics"
pytestmark = pytest.mark.django_db


def ack_path(command_id: int) -> str:
    return f"/api/v1/agent/commands/{command_id}/ack"


@pytest.fixture
def ranks(agent, agent_post, settings):
    """Three ranks at step 100, one step per 0.1 s, heartbeating through HTTP."""
    settings.COMMAND_APPLY_MARGIN_SECONDS = 2.0
    settings.COMMAND_SPLIT_SECONDS = 30.0

    def beat(rank: int, step: int, status: str = "running") -> list[dict]:
        body = {"step": step, "status": status, "rank": rank, "world_size": 3, "pid": 10 + rank}
        response = agent_post(HEARTBEAT, body | {"hostname": f"node-{rank}"})
        assert response.status_code == 200, response.content
        return response.json()["commands"]

    with time_machine.travel(timezone.now(), tick=False) as clock:
        for step in (80, 90, 100):
            if step > 80:
                clock.shift(1)
            for rank in range(3):
                beat(rank, step + rank)  # rank 2 is ahead: the highest step counts
        yield beat, clock


def ack(agent_post, command_id: int, rank: int | None, step: int, status: str = "succeeded"):
    result = {"step": step} | ({"rank": rank} if rank is not None else {})
    response = agent_post(ack_path(command_id), {"status": status, "result": result})
    assert response.status_code == 200, response.content
    return response.json()


def pause(agent) -> Command:
    return issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN", severity="L3").command


def test_the_brake_applies_above_every_rank_and_succeeds_when_all_ack_that_step(
    agent, agent_post, ranks
):
    beat, _ = ranks
    command = pause(agent)
    # Highest step 102 (rank 2), 0.1 s per step, 2 s of margin: 20 steps ahead.
    assert command.apply_at_step == 122
    assert beat(0, 103)[0]["apply_at_step"] == 122
    assert ack(agent_post, command.pk, 0, 122) == {"id": command.pk, "status": "delivered"}
    assert ack(agent_post, command.pk, 0, 122)["status"] == "delivered"  # a retry: still one
    # Rank 0 acked; ranks 1 and 2 (no websocket) still get it in their heartbeat replies,
    # rank 0 no longer (a restarted rank 0 must not apply it twice).
    assert [c["id"] for c in beat(1, 104)] == [command.pk]
    assert beat(0, 122, "paused") == []
    ack(agent_post, command.pk, 1, 122)
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSING  # not yet
    assert ack(agent_post, command.pk, 2, 122)["status"] == "succeeded"
    command.refresh_from_db()
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED
    assert command.result["step"] == 122 and set(command.result["ranks"]) == {"0", "1", "2"}
    assert CommandAck.objects.filter(command=command).count() == 3
    assert beat(2, 122, "paused") == []  # done: no longer handed out
    assert not Alert.objects.filter(job_id=agent.job_id, rule_key=RULE_KEY).exists()


def test_ranks_acking_different_steps_fail_the_command_with_an_l3_split_alert(
    agent, agent_post, ranks
):
    command = pause(agent)
    ack(agent_post, command.pk, 2, 131)
    assert ack(agent_post, command.pk, 0, 132)["status"] == "failed"
    command.refresh_from_db()
    assert "rank 2 at step 131" in command.error and "rank 0 at step 132" in command.error
    assert Job.objects.get(pk=agent.job_id).status != JobStatus.PAUSED
    alert = Alert.objects.get(job_id=agent.job_id, rule_key=RULE_KEY)
    assert alert.severity == "L3" and alert.action == "none"
    assert "rank 2 at step 131" in alert.description and "node-2" in alert.nodes


def test_a_rank_that_fails_fails_the_command_naming_it(agent, agent_post, ranks):
    command = pause(agent)
    ack(agent_post, command.pk, 0, 122)
    response = agent_post(
        ack_path(command.pk),
        {"status": "failed", "result": {"step": 122, "rank": 1}, "error": "disk full"},
    )
    assert response.json()["status"] == "failed"
    assert "rank 1: disk full" in Command.objects.get(pk=command.pk).error


def test_a_partial_ack_past_its_deadline_is_a_split_job_alert_naming_the_ranks(
    agent, agent_post, ranks
):
    _, clock = ranks
    command = pause(agent)
    ack(agent_post, command.pk, 0, 122)
    ack(agent_post, command.pk, 2, 122)
    clock.shift(29)
    assert flag_split_commands() == 0
    clock.shift(2)
    assert flag_split_commands() == 1
    assert flag_split_commands() == 0  # once while it lasts
    alert = Alert.objects.get(job_id=agent.job_id, rule_key=RULE_KEY)
    assert "acknowledged by ranks 0, 2, not by rank 1" in alert.description
    assert alert.nodes == ["node-1"] and alert.severity == "L3"
    # The last rank acks the same step: the job is one again, and paused.
    assert ack(agent_post, command.pk, 1, 122)["status"] == "succeeded"
    alert.refresh_from_db()
    assert alert.status == "resolved"
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


def test_an_ack_without_a_rank_is_the_whole_jobs(agent, agent_post, ranks):
    # The executor's acks (Slurm) and older SDKs name no rank: they settle the command.
    command = pause(agent)
    assert ack(agent_post, command.pk, None, 122)["status"] == "succeeded"


@pytest.mark.parametrize("rank", [-1, "1", 1.5, True, 2**31])
def test_a_rank_that_is_not_one_is_refused_naming_the_field(agent, agent_post, ranks, rank):
    command = pause(agent)
    response = agent_post(
        ack_path(command.pk), {"status": "succeeded", "result": {"step": 1, "rank": rank}}
    )
    assert response.status_code == 400
    assert "result.rank" in response.json()["fields"]
    assert Command.objects.get(pk=command.pk).status != CommandStatus.SUCCEEDED
    assert not CommandAck.objects.exists()


def test_a_heartbeat_seconds_old_counts_the_steps_made_since(agent, ranks):
    _, clock = ranks
    clock.shift(0.55)  # every rank is 5 steps further on at 0.1 s per step
    assert pause(agent).apply_at_step == 102 + 5 + 20


def test_a_command_waiting_for_its_step_is_not_an_unapplied_one(agent, agent_post, ranks):
    beat, _ = ranks
    command = issue_command(agent.job_id, "lower_lr", reason="loss rising", severity="L2").command
    assert command.apply_at_step == 122
    beat(0, 103)  # delivered at step 102 (the job's step)
    agent_post(METRICS, {"points": [{"name": "loss", "step": 121 + UNAPPLIED_STEPS, "value": 1}]})
    assert flag_unapplied_commands() == 0  # counted from step 122, not from the delivery
    agent_post(METRICS, {"points": [{"name": "loss", "step": 122 + UNAPPLIED_STEPS, "value": 1}]})
    assert flag_unapplied_commands() == 1


def test_a_ranks_metrics_reply_leaves_out_what_that_rank_acked(agent, agent_post, ranks):
    """As the heartbeat replies do: the batch's points name their rank; a batch mixing ranks
    (none such from the SDK) gets every open command."""
    beat, _ = ranks
    command = pause(agent)
    ack(agent_post, command.pk, 0, 122)

    def metrics(batch: str, *point_ranks: int) -> list[int]:
        points = [
            {"name": "loss", "step": 104 + i, "value": 1.0, "rank": rank}
            for i, rank in enumerate(point_ranks)
        ]
        response = agent_post(METRICS, {"batch": batch, "points": points})
        assert response.status_code == 202, response.content
        return [c["id"] for c in response.json()["commands"]]

    assert metrics("rank-0", 0, 0) == []  # rank 0 acked: a restarted rank 0 must not re-apply
    assert metrics("rank-1", 1, 1) == [command.pk]
    assert metrics("mixed", 0, 1) == [command.pk]
    assert metrics("rank-0", 0, 0) == []  # a retried batch: the same answer


def test_where_every_rank_holds_on_its_guard_the_brake_applies_at_that_step(
    agent, agent_post, ranks
):
    """A NaN spread to every rank's gradients: each rank's guard refused the update of step
    110 and holds there, saying "holding". The brake is applied at 110 — the checkpoint then
    holds the last good state — not a margin of steps (and a projection) past the anomaly."""
    beat, clock = ranks
    clock.shift(1)
    for rank in range(3):
        beat(rank, 110, "holding")
    clock.shift(2)  # a held rank takes no step, however long it waits
    assert pause(agent).apply_at_step == 110


def test_a_holding_rank_is_not_projected_but_the_others_are(agent, agent_post, ranks):
    beat, clock = ranks
    clock.shift(1)
    beat(0, 110, "holding")
    beat(1, 105)
    beat(2, 104)  # ranks 1 and 2 still train: the margin stays, over the highest step
    clock.shift(0.55)
    # Rank 0 counts at 110 (projected at its 0.1 s a step it would be 115); ranks 1 and 2
    # are projected below it; the margin is 2 s of the slowest rank's smoothed 0.18 s steps.
    assert pause(agent).apply_at_step == 110 + 12
