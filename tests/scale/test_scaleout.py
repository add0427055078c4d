"""The scaled-out console: two Daphne processes behind HAProxy running the shipped
deploy/haproxy.cfg, two Celery worker processes and beat (bench/_prodstack.py, what
bench/scaleout.py measures), and a job of 104 simulated ranks on 13 nodes, each node's ranks
speaking through its forwarder (bundles, and one websocket per node through the balancer).
A NaN on one rank brakes every rank at one step, every rank hears the brake on its node's
websocket, and every point is stored once. Behaviour only, never speed: the waits end on the
event."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from bench._fleet_sim import Fleet, FleetConfig
from bench._prodstack import HAPROXY, Stack
from breakers.models import Command
from breakers.storage.points import stored_points
from incidents.models import Job, JobRank

RANKS, PER_NODE = 104, 8
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not Path(HAPROXY).exists() and not shutil.which("haproxy"), reason="no HAProxy"
    ),
]


async def brake(config: FleetConfig) -> Fleet:
    fleet = Fleet(config)
    fleet.start()
    # Train until every rank has had a batch accepted, then a NaN.
    while any(rank.sequence < 2 for rank in fleet.ranks):
        await asyncio.sleep(0.25)
    fleet.inject_nan()
    held = await fleet.wait_held(timeout=120)
    for rank in fleet.ranks:  # what is still pending goes out before the ranks stop
        await rank.send_batch()
    await fleet.close()
    assert held, f"only {len(fleet.traffic.acked)} of {RANKS} ranks held"
    return fleet


@pytest.fixture
def scaled_out():
    """Two web processes behind HAProxy, two workers of one process each, beat."""
    from breakers.detection.rules import install_default_pack
    from config.celery import app
    from tests.conftest import server_environment

    install_default_pack()  # an earlier transactional test's flush emptied the rules
    running = Stack(2, server_environment(), workers=2, concurrency=1)
    try:
        yield running.start()
    finally:
        running.stop()
        app.control.purge()  # beat's last ticks name this test's jobs: not the next test's


def test_a_scaled_out_console_brakes_every_rank_of_thirteen_nodes_at_one_step(
    scaled_out, make_agent
):
    agent = make_agent()
    # The brake under test is the NaN's. On a machine loaded by other work the console may
    # record heartbeats late enough to judge ranks silent at the 10 s floor (README.md
    # "Scale-out, run"), which would brake the job before the NaN: a generous deadline.
    Job.objects.filter(pk=agent.job_id).update(heartbeat_timeout_seconds=300)
    web_before = scaled_out.web_cpu()
    config = FleetConfig(
        url=scaled_out.urls[2],  # the balancer over both web processes
        token=agent.token,
        ranks=RANKS,
        ranks_per_node=PER_NODE,
        heartbeat_in_batch=True,
        node_bundles=True,
    )
    fleet = asyncio.run(brake(config))
    traffic = fleet.traffic

    steps = {step for step, _ in traffic.acked.values()}
    assert len(traffic.acked) == RANKS and len(steps) == 1, steps
    # Every node's one websocket, through HAProxy, carried the brake to each of its ranks.
    assert sorted(rank for rank, count in traffic.pushed.items() if count) == list(range(RANKS))
    command = Command.objects.get(job_id=agent.job_id, kind="checkpoint_and_pause")
    assert command.status == "succeeded" and command.apply_at_step in steps
    assert Job.objects.get(pk=agent.job_id).status == "paused"
    assert JobRank.objects.filter(job_id=agent.job_id).count() == RANKS
    # Nothing lost, nothing twice: every point a rank was told was accepted is stored once.
    refused = {k: v for k, v in traffic.requests.items() if k[1] not in (200, 202)}
    points = stored_points(agent.job_id)
    assert len(points) == traffic.accepted_points, refused
    assert len({(p.rank, p.name, p.step) for p in points}) == len(points)
    assert any(p.name == "train/loss" and p.value != p.value for p in points)  # the NaN
    assert traffic.requests[("bundle", 200)] > 0 and traffic.parts > 2 * PER_NODE
    # The balancer spread the job over both web processes.
    spent = [after - before for before, after in zip(web_before, scaled_out.web_cpu(), strict=True)]
    assert all(seconds > 0.5 for seconds in spent), spent
