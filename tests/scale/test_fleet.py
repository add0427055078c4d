"""A job of 120 simulated ranks on two nodes against the real console (Daphne, a Celery
worker, PostgreSQL, Redis), speaking the SDK's wire protocol at its defaults (bench/fleet.py's
simulator), rank by rank or each node through its forwarder (bundles, one websocket per node):
a NaN on one rank brakes every rank at one step, and every point is stored.
Behaviour only, never speed: the waits are generous and end on the event."""

from __future__ import annotations

import asyncio

import pytest

from bench._fleet_sim import Fleet, FleetConfig
from breakers.models import Command
from breakers.storage.points import stored_points
from incidents.models import Job, JobRank

RANKS = 120
pytestmark = pytest.mark.django_db(transaction=True)


async def brake_a_fleet(config: FleetConfig) -> Fleet:
    fleet = Fleet(config)
    fleet.start()
    # Train until every rank has had a batch accepted, then a NaN.
    while len({rank for rank in range(RANKS) if fleet.ranks[rank].sequence >= 2}) < RANKS:
        await asyncio.sleep(0.25)
    fleet.inject_nan()
    held = await fleet.wait_held(timeout=120)
    for rank in fleet.ranks:  # what is still pending goes out before the ranks stop
        await rank.send_batch()
    await fleet.close()
    assert held, f"only {len(fleet.traffic.acked)} of {RANKS} ranks held"
    return fleet


@pytest.mark.usefixtures("worker")
@pytest.mark.parametrize("node_bundles", [False, True], ids=["rank-by-rank", "node-bundles"])
def test_every_rank_of_two_nodes_holds_at_one_step_and_nothing_is_lost(
    live_console, make_agent, node_bundles
):
    agent = make_agent()
    config = FleetConfig(
        url=live_console,
        token=agent.token,
        ranks=RANKS,
        ranks_per_node=RANKS // 2,
        heartbeat_in_batch=True,  # as the SDK sends them to a console of protocol 3
        # The first node's ranks hear commands on the websocket, the second's in replies.
        websocket_nodes={0},
        # Each node's ranks through one forwarder: bundles and the node's one websocket.
        node_bundles=node_bundles,
    )
    fleet = asyncio.run(brake_a_fleet(config))

    steps = {step for step, _ in fleet.traffic.acked.values()}
    assert len(fleet.traffic.acked) == RANKS and len(steps) == 1, steps
    command = Command.objects.get(job_id=agent.job_id, kind="checkpoint_and_pause")
    assert command.status == "succeeded" and command.apply_at_step in steps
    assert Job.objects.get(pk=agent.job_id).status == "paused"
    seen = JobRank.objects.filter(job_id=agent.job_id)
    assert seen.count() == RANKS
    assert {r.hostname for r in seen} == {"sim-node-0000", "sim-node-0001"}
    # Nothing lost, nothing twice: every point a rank was told was accepted is stored once.
    refused = {k: v for k, v in fleet.traffic.requests.items() if k[1] not in (200, 202)}
    points = stored_points(agent.job_id)
    assert len(points) == fleet.traffic.accepted_points, refused
    assert len({(p.rank, p.name, p.step) for p in points}) == len(points)
    assert any(p.name == "train/loss" and p.value != p.value for p in points)  # the NaN
    bundles = fleet.traffic.requests[("bundle", 200)]
    assert (bundles > 0 and fleet.traffic.parts > 2 * bundles) == node_bundles
