"""Checkpoint sets on the console: only complete sets are catalogued, a missing or
contradicting shard is refused naming its rank, a roll back carries the whole set."""

from __future__ import annotations

import pytest

from breakers.checkpoints import catalogue, roll_back_params, roll_back_target
from breakers.models import Checkpoint, CheckpointSet
from incidents.heartbeats import record_heartbeat

pytestmark = pytest.mark.django_db

URL = "/api/v1/agent/checkpoints"


def _shard(rank: int, step: int = 40) -> dict:
    return {
        "rank": rank,
        "path": f"/ck/step-{step:08d}.rank-{rank}.pt",
        "bytes": 10 + rank,
        "sha256": f"{rank:x}" * 64,
    }


def _report(world_size: int = 3, shards: list | None = None, step: int = 40) -> dict:
    shards = [_shard(r, step) for r in range(world_size)] if shards is None else shards
    return {
        "path": f"/ck/step-{step:08d}.pt",
        "sha256": "0" * 64,
        "step": step,
        "rank": 0,
        "set": {
            "manifest": f"/ck/step-{step:08d}.manifest.json",
            "manifest_sha256": "e" * 64,
            "world_size": world_size,
            "shards": shards,
        },
    }


@pytest.fixture
def three_ranks(agent):
    for rank in range(3):
        record_heartbeat(agent.job_id, step=40, status="running", rank=rank, world_size=3)
    return agent


def test_a_complete_set_is_catalogued_and_a_roll_back_carries_it(three_ranks, agent_post):
    # A rank's lone file first: not offered (no set holds it yet).
    lone = {"path": "/ck/step-00000041.rank-2.pt", "sha256": "2" * 64, "step": 41, "rank": 2}
    assert agent_post(URL, lone).status_code == 201
    assert catalogue(three_ranks.job_id) == []
    answer = agent_post(URL, _report())
    assert answer.status_code == 201, answer.json()
    assert answer.json()["set"]["world_size"] == 3
    assert agent_post(URL, _report()).status_code == 200  # the same set again: the same rows
    assert CheckpointSet.objects.count() == 1
    files = Checkpoint.objects.filter(checkpoint_set__isnull=False).order_by("rank")
    assert [f.rank for f in files] == [0, 1, 2]
    [entry] = catalogue(three_ranks.job_id)
    assert entry["step"] == 40 and entry["preselected"] and entry["set"]["shards"][2] == _shard(2)
    params = roll_back_params(roll_back_target(three_ranks.job_id, str(entry["id"])))
    assert params["set"]["manifest_sha256"] == "e" * 64 and len(params["set"]["shards"]) == 3


def test_a_set_missing_a_rank_is_refused_naming_it(three_ranks, agent_post):
    answer = agent_post(URL, _report(shards=[_shard(0), _shard(2)]))
    assert answer.status_code == 400
    assert "rank(s) 1 missing" in answer.json()["fields"]["set.shards"]
    twice = agent_post(URL, _report(shards=[_shard(0), _shard(0), _shard(2)]))
    assert "each rank once" in twice.json()["fields"]["set.shards[1]"]
    assert not CheckpointSet.objects.exists() and not Checkpoint.objects.exists()


def test_a_shard_contradicting_its_ranks_own_report_is_refused_naming_the_rank(
    three_ranks, agent_post
):
    own = {**_shard(1), "step": 40, "sha256": "9" * 64}
    assert agent_post(URL, own).status_code == 201
    answer = agent_post(URL, _report())
    assert answer.status_code == 400
    assert answer.json()["fields"]["set.shards"].startswith("rank 1: its file")
    assert not CheckpointSet.objects.exists()


def test_a_set_of_another_world_size_is_refused(three_ranks, agent_post):
    answer = agent_post(URL, _report(world_size=2))
    assert answer.status_code == 400
    assert "3 ranks, not 2" in answer.json()["fields"]["set.world_size"]


@pytest.mark.django_db(transaction=True)
def test_a_ranks_report_and_the_ack_of_the_same_brake_do_not_deadlock():
    """Rank 0 reports its checkpoint while the last rank's ack, holding the job's row, records
    the same file from the brake's result. The report once inserted the row first and then
    waited at commit on the job's row (its foreign key check) while the ack waited on that
    uncommitted row: PostgreSQL broke the deadlock with an error, answered 503. Now the report
    takes the job's row first and simply finds the ack's row. Waits on PostgreSQL's own view
    of who is waiting on a lock, never on a timer."""
    import threading

    from django.db import connection, transaction

    from breakers.checkpoints import parse_report, record_checkpoint
    from incidents.jobs import create_job
    from incidents.models import Job
    from tests.support.waiting import backend_pid, wait_for, waits_on_a_lock

    job_id = create_job("research", "ck-race", "training").job.pk
    report = parse_report({"path": "/ck/step-00000040.pt", "sha256": "a" * 64, "step": 40})
    reporter: dict = {}

    def report_it() -> None:
        try:
            reporter["pid"] = backend_pid()
            reporter["row"] = record_checkpoint(job_id, report)
        except Exception as error:  # noqa: BLE001 - the test reports it below
            reporter["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=report_it)
    with transaction.atomic():  # the ack: the job's row first, then the brake's checkpoint
        Job.objects.select_for_update().get(pk=job_id)
        thread.start()
        wait_for(
            lambda: "pid" in reporter and waits_on_a_lock(reporter.get("pid")),
            "the report waits",
            60,
        )
        acked, created = record_checkpoint(job_id, report)
        assert created
    thread.join(timeout=60)
    assert "error" not in reporter, reporter.get("error")
    assert reporter["row"] == (acked, False)
    assert Checkpoint.objects.filter(job_id=job_id).count() == 1
