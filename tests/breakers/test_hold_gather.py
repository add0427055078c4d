"""A multi-rank job's brake awaits its ranks' holds (breakers.control.apply_at, "Gathering
the holds"), through the real stack: node bundles over HTTP, Redis, the real Celery worker,
PostgreSQL. A NaN makes every rank's guard hold at one step, but the nodes' "holding"
heartbeats land a bundle apart: the brake is named at the held step once the last node's
hold is in, and with the margin once the bound has passed with a rank that never holds."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db.models import F

from breakers.models import Command, CommandAck, EvaluationState
from breakers.storage.points import stored_points
from incidents.models import Alert, Job, JobStatus
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/agent/bundle"
HELD = 110
NODES = {"gpu-a": (0, 1), "gpu-b": (2, 3)}


def beat(rank: int, node: str, step: int, status: str) -> dict:
    body = {"step": step, "status": status, "rank": rank, "world_size": 4, "pid": 100 + rank}
    return {"path": "heartbeat", "body": json.dumps(body | {"hostname": node})}


def points(rank: int, node: str, name: str, steps: range | list[int], value: float) -> dict:
    listed = [{"name": name, "step": s, "value": value, "node": node} for s in steps]
    body = {"rank": rank, "batch": f"r{rank}-{name}-{steps[0]}", "points": listed}
    return {"path": "metrics", "body": json.dumps(body)}


@pytest.fixture
def job(agent, agent_post, settings, worker):
    """Four ranks on two nodes that trained to step 100, the bound long enough that only
    the ranks' holds (or the test) end the wait."""
    settings.HOLD_GATHER_SECONDS = 3600.0

    def send(*parts: dict) -> None:
        response = agent_post(URL, {"parts": list(parts)})
        assert response.status_code == 200, response.content
        assert {r["status"] for r in response.json()["results"]} <= {200, 202}, response.content

    for node, ranks in NODES.items():
        send(*[beat(rank, node, 100, "running") for rank in ranks])
        send(*[points(rank, node, "loss", range(90, 101), 2.0) for rank in ranks])
    return send


def hold(send, node: str, ranks: tuple[int, ...]) -> None:
    """A node's ranks hold at the step, say so, then send their offending points."""
    send(*[beat(rank, node, HELD, "holding") for rank in ranks])
    send(*[points(rank, node, "guard.skipped_updates", [HELD], 1.0) for rank in ranks])


def ack(command_id: int, rank: int, step: int) -> dict:
    body = {"status": "succeeded", "result": {"step": step, "rank": rank}}
    return {"path": f"commands/{command_id}/ack", "body": json.dumps(body)}


def awaiting(job_id: int) -> bool:
    """The worker evaluated the guard's points and stopped before the brake, nothing kept."""
    state = EvaluationState.objects.filter(job_id=job_id).first()
    return state is not None and state.holds_awaited_since is not None


def the_brake(job_id: int) -> Command:
    return wait_for(
        lambda: Command.objects.filter(job_id=job_id, kind="checkpoint_and_pause").first(),
        "the brake",
    )


def test_the_brake_awaits_the_last_nodes_hold_and_applies_at_the_held_step(agent, job):
    hold(job, "gpu-a", NODES["gpu-a"])
    wait_for(lambda: awaiting(agent.job_id), "the evaluation to await the other holds")
    assert not Command.objects.filter(job_id=agent.job_id).exists()
    assert not Alert.objects.filter(job_id=agent.job_id).exists()  # rolled back, not lost

    hold(job, "gpu-b", NODES["gpu-b"])
    command = the_brake(agent.job_id)
    assert command.apply_at_step == HELD  # not a margin of steps past the anomaly
    # Every point evaluated once: the chunk that awaited the holds was kept by no look.
    stored = stored_points(agent.job_id)
    state = wait_for(
        lambda: EvaluationState.objects.filter(
            job_id=agent.job_id, cursor=max(p.id for p in stored)
        ).first(),
        "every point evaluated",
    )
    assert state.points_evaluated == len(stored) and state.holds_awaited_since is None
    # Both nodes refused the update: one alert for the job, not one per node.
    alert = Alert.objects.get(job_id=agent.job_id, rule_key="update-refused-by-guard")
    assert alert.node == "" and alert.first_step == HELD

    for ranks in NODES.values():  # each node's ranks acknowledge in its bundle
        job(*[ack(command.pk, rank, HELD) for rank in ranks])
    command.refresh_from_db()
    assert command.status == "succeeded" and command.result["step"] == HELD
    assert CommandAck.objects.filter(command=command).count() == 4
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED


def test_a_rank_that_never_holds_lets_the_brake_go_after_the_bound_with_the_margin(agent, job):
    hold(job, "gpu-a", NODES["gpu-a"])
    hold(job, "gpu-b", (2,))  # rank 3 died inside the collective: it never says it holds
    wait_for(lambda: awaiting(agent.job_id), "the evaluation to await rank 3's hold")
    assert not Command.objects.filter(job_id=agent.job_id).exists()

    # The bound passes (the wait began longer ago than it): the next look brakes anyway.
    EvaluationState.objects.filter(job_id=agent.job_id).update(
        holds_awaited_since=F("holds_awaited_since") - timedelta(seconds=3601)
    )
    command = the_brake(agent.job_id)
    assert command.apply_at_step is not None and command.apply_at_step > HELD  # the margin
    assert EvaluationState.objects.get(job_id=agent.job_id).holds_awaited_since is None
