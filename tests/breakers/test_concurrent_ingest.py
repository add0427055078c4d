"""One job's batches are written concurrently (no lock orders them), and the id-cursor
readers still see every point exactly once: a batch that took lower ids and commits later is
never skipped (breakers.storage.writers' horizon)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from django.db import connection

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_batch
from breakers.detection.evaluation import evaluate_job
from breakers.models import EvaluationState, RollupCursor
from breakers.storage.points import stored_points
from breakers.storage.rollups import roll_up_job
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def batch(rank: int, step: int, metrics: int = 3) -> list[PointIn]:
    now = datetime.now(tz=UTC)
    return [
        PointIn(name=f"m{m}", step=step, value=1.0 + m, time=now, node="n0", rank=rank)
        for m in range(metrics)
    ]


def in_thread(target, *args, **kwargs) -> threading.Thread:
    def run():
        try:
            target(*args, **kwargs)
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def waiting_for_writers() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
        return cursor.fetchone() is not None


def test_a_batch_does_not_wait_for_another_of_its_job_and_is_not_skipped(make_agent):
    job_id = make_agent().job_id
    at = datetime.now(tz=UTC)
    # The job is at step 10 already and its metric time is fresh: the two batches below move
    # neither, so nothing of theirs touches the job's row (the first batch of a new step
    # does, from its last statement to its commit).
    store_batch(job_id, batch(0, 10), "warm", at, job_is_pending=True)
    evaluate_job(job_id)
    holding, release = threading.Event(), threading.Event()

    def held_open():  # takes its ids, then stays uncommitted until released
        store_batch(
            job_id,
            batch(1, 5),
            "slow",
            at,
            job_is_pending=False,
            then=lambda: (holding.set(), release.wait(30)),
        )

    slow = in_thread(held_open)
    assert holding.wait(30)
    # A second batch of the same job, with higher ids, commits while the first is open: it
    # did not queue behind the first (the old job row lock made it wait for the commit).
    fast = in_thread(store_batch, job_id, batch(2, 5), "fast", at, job_is_pending=False)
    fast.join(10)
    assert not fast.is_alive(), "a batch of the job waited for another batch's commit"
    # The evaluator runs meanwhile, in its own thread: it waits for the open batch to end
    # (were it to read now, its cursor would pass the fast batch's ids and skip the slow
    # one's for ever). Then the slow batch commits.
    evaluator = in_thread(evaluate_job, job_id)
    wait_for(lambda: not evaluator.is_alive() or waiting_for_writers(), "the evaluator to read")
    release.set()
    slow.join(30)
    evaluator.join(30)
    evaluate_job(job_id)
    state = EvaluationState.objects.get(job_id=job_id)
    assert state.points_evaluated == len(stored_points(job_id)) == 9
    assert state.cursor == max(p.id for p in stored_points(job_id))


def test_many_ranks_writing_at_once_are_evaluated_and_rolled_up_exactly_once(make_agent):
    job_id = make_agent().job_id
    store_batch(job_id, batch(0, 0), "warm", job_is_pending=True)
    stop = threading.Event()

    def rank(index: int) -> None:
        for step in range(1, 16):
            store_batch(job_id, batch(index, step), f"{index}-{step}", job_is_pending=False)

    def reader(read) -> None:
        while not stop.is_set():
            read(job_id)

    readers = [in_thread(reader, evaluate_job), in_thread(reader, roll_up_job)]
    writers = [in_thread(rank, index) for index in range(1, 9)]
    for thread in writers:
        thread.join(120)
    stop.set()
    for thread in readers:
        thread.join(60)
    evaluate_job(job_id)
    roll_up_job(job_id)
    stored = stored_points(job_id)
    assert len(stored) == 3 + 8 * 15 * 3
    state = EvaluationState.objects.get(job_id=job_id)
    assert state.points_evaluated == len(stored)  # none skipped, none twice
    assert RollupCursor.objects.get(job_id=job_id).cursor == max(p.id for p in stored)
