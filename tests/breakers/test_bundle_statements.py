"""What serving a node's bundle asks of PostgreSQL: a pinned number of statements, the same
for a bundle of steady heartbeats as for one of two (their ranks' rows are read and written
together), with every rank's row as its own beat would have left it."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from breakers.agent import service
from breakers.agent.bundle import bundle_reply
from incidents.models import Job, JobRank

pytestmark = pytest.mark.django_db
RANKS = 8
# A steady node's bundle, whatever number of its ranks' beats ride in it or come on their
# own: the transaction's two, the batch ids' claim, the job and the beating ranks' rows read,
# their one compare-and-swap UPDATE, the Slurm context's (none) one UPDATE, the writers'
# announcement, the job's step, the commands owed. The points' COPY is not a Django statement.
STEADY_BUNDLE_STATEMENTS = 9
# A bundle of a node's first beats, however many ranks: the transaction's two, the job and
# the ranks' rows read (none yet), the job's row locked, the ranks seated meanwhile, their
# one INSERT, the earliest deadline, the job's row written, the Slurm context's (none) one
# UPDATE, the commands owed.
NEW_RANKS_BUNDLE_STATEMENTS = 10
# Ranks back from a silence: the steady bundle's, and the job's row locked, its earliest
# deadline read, its row written once, its silence ended (the mark cleared, the alert looked
# for) and the job read back.
RANKS_BACK_BUNDLE_STATEMENTS = 15


def beat(rank: int, step: int, **extra) -> dict:
    body = {"step": step, "status": "running", "pid": 100 + rank, "hostname": "gpu-1"}
    return body | {"rank": rank, "world_size": RANKS} | extra


def batch(rank: int, step: int, riding: dict | None = None) -> dict:
    body: dict = {
        "rank": rank,
        "batch": f"r{rank}-{step}",
        "points": [{"name": "loss", "step": step, "value": "NaN"}],
    }
    if riding is not None:
        body["heartbeat"] = riding
    return {"path": "metrics", "body": json.dumps(body)}


def serve(job_id: int, parts: list[dict]) -> tuple[list[dict], list[str]]:
    job = Job.objects.get(pk=job_id)  # as the agent gate hands it to the route
    with CaptureQueriesContext(connection) as queries:
        results = bundle_reply(job, json.dumps({"parts": parts}).encode())["results"]
    assert all(r["status"] < 300 for r in results), results
    return results, [q["sql"] for q in queries]


@pytest.fixture
def steady_job(agent, monkeypatch, django_capture_on_commit_callbacks):
    """A job whose eight ranks beat twice (each its step time measured, the job's deadline
    the earliest of theirs) and whose metric names are known (what the caches of a running
    web process hold once its first batch committed)."""
    monkeypatch.setattr(service, "schedule_evaluation", lambda job_id: None)
    with django_capture_on_commit_callbacks(execute=True):
        for step in (1, 2):
            beats = [{"path": "heartbeat", "body": json.dumps(beat(r, step))} for r in range(RANKS)]
            serve(agent.job_id, beats)
        serve(agent.job_id, [batch(r, 2) for r in range(RANKS)])
    return agent.job_id


def test_a_steady_bundle_costs_its_pinned_statements(steady_job):
    parts = [batch(r, 3, beat(r, 3) if r in (3, 5) else None) for r in range(RANKS)]
    _, statements = serve(steady_job, parts)
    assert len(statements) == STEADY_BUNDLE_STATEMENTS, "\n".join(statements)


def test_every_rank_beating_costs_no_statement_more(steady_job):
    parts = [batch(r, 3, beat(r, 3, sync_step=3, compute_seconds=0.5)) for r in range(1, RANKS)]
    parts += [{"path": "heartbeat", "body": json.dumps(beat(0, 3))}]
    before = {seat.rank: seat for seat in JobRank.objects.filter(job_id=steady_job)}
    # Rank 0's beat writes the job's row too (its agent fields): the steady ones come apart.
    _, statements = serve(steady_job, parts[:-1])
    assert len(statements) == STEADY_BUNDLE_STATEMENTS, "\n".join(statements)
    job = Job.objects.get(pk=steady_job)
    for seat in JobRank.objects.filter(job_id=steady_job, rank__gte=1):
        assert (seat.step, seat.sync_step, seat.compute_seconds) == (3, 3, 0.5)
        assert seat.last_heartbeat_at > before[seat.rank].last_heartbeat_at
        assert seat.step_time_seconds is not None  # measured between its two beats
        assert seat.heartbeat_deadline > before[seat.rank].heartbeat_deadline
        assert job.heartbeat_deadline <= seat.heartbeat_deadline  # the watchdog finds it


def test_a_ranks_second_beat_in_one_bundle_is_its_last_word(steady_job):
    parts = [
        batch(4, 5, beat(4, 5)),
        {"path": "heartbeat", "body": json.dumps(beat(4, 6, status="holding"))},
        batch(6, 5, beat(6, 5)),
    ]
    serve(steady_job, parts)
    seats = {s.rank: (s.step, s.status) for s in JobRank.objects.filter(job_id=steady_job)}
    assert seats[4] == (6, "holding") and seats[6] == (5, "running")


def test_a_beat_from_another_process_is_a_restart_not_a_steady_beat(steady_job):
    serve(steady_job, [batch(2, 4, beat(2, 4, pid=4242)), batch(3, 4, beat(3, 4))])
    seats = {s.rank: s.pid for s in JobRank.objects.filter(job_id=steady_job)}
    assert seats[2] == 4242 and seats[3] == 103


def _start(job_id: int, world: int) -> None:
    """Rank 0 beats first, alone (the job-wide beat that starts the job)."""
    serve(job_id, [{"path": "heartbeat", "body": json.dumps(beat(0, 1, world_size=world))}])


def _newcomers(world: int) -> list[dict]:
    return [
        {"path": "heartbeat", "body": json.dumps(beat(r, 1 + r % 3, world_size=world))}
        for r in range(1, world)
    ]


@pytest.mark.parametrize("world", [8, 32])
def test_a_nodes_new_ranks_are_seated_together_in_pinned_statements(make_agent, world):
    """However many new ranks a bundle brings, one lock of the job's row, one INSERT and one
    write of the job's row (one at a time, 8 statements a rank)."""
    job_id = make_agent().job_id
    _start(job_id, world)
    _, statements = serve(job_id, _newcomers(world))
    assert len(statements) == NEW_RANKS_BUNDLE_STATEMENTS, "\n".join(statements)
    assert sum("INSERT INTO" in sql and "incidents_jobrank" in sql for sql in statements) == 1
    seats = {seat.rank: seat for seat in JobRank.objects.filter(job_id=job_id)}
    assert sorted(seats) == list(range(world))
    job = Job.objects.get(pk=job_id)
    assert job.heartbeat_deadline == min(seat.heartbeat_deadline for seat in seats.values())
    assert job.current_step == 3 and job.world_size == world
    assert all(
        (s.step, s.status, s.pid) == (1 + r % 3, "running", 100 + r) for r, s in seats.items() if r
    )


def test_a_retried_bundle_of_new_ranks_seats_nobody_twice(make_agent):
    job_id = make_agent().job_id
    _start(job_id, RANKS)
    serve(job_id, _newcomers(RANKS))
    first = {seat.rank: seat.pk for seat in JobRank.objects.filter(job_id=job_id)}
    serve(job_id, _newcomers(RANKS))  # the same beats again: steady ones now
    assert {seat.rank: seat.pk for seat in JobRank.objects.filter(job_id=job_id)} == first


def test_a_new_rank_that_resizes_the_job_comes_alone(make_agent):
    job_id = make_agent().job_id
    _start(job_id, RANKS)
    parts = _newcomers(RANKS)[:3]
    parts.append({"path": "heartbeat", "body": json.dumps(beat(4, 1, world_size=RANKS + 1))})
    serve(job_id, parts)
    job = Job.objects.get(pk=job_id)
    assert job.world_size == RANKS + 1
    assert sorted(JobRank.objects.filter(job_id=job_id).values_list("rank", flat=True)) == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_ranks_back_from_a_silence_come_back_together(steady_job):
    """Ranks past their deadlines (a console that stalled): their beats write the job's row
    once, under one lock, and end its silence (one at a time: 8 statements a rank)."""
    past = timezone.now() - timedelta(seconds=1)
    rank_0 = JobRank.objects.get(job_id=steady_job, rank=0).heartbeat_deadline
    JobRank.objects.filter(job_id=steady_job, rank__gte=1).update(heartbeat_deadline=past)
    Job.objects.filter(pk=steady_job).update(heartbeat_deadline=past, heartbeat_overdue_since=past)
    parts = [batch(r, 3, beat(r, 3)) for r in range(1, RANKS)]
    _, statements = serve(steady_job, parts)
    assert len(statements) == RANKS_BACK_BUNDLE_STATEMENTS, "\n".join(statements)
    job = Job.objects.get(pk=steady_job)
    assert job.heartbeat_overdue_since is None
    assert job.heartbeat_deadline == rank_0  # the earliest again
    back = JobRank.objects.filter(job_id=steady_job, rank__gte=1)
    assert all(seat.heartbeat_deadline > timezone.now() and seat.step == 3 for seat in back)
