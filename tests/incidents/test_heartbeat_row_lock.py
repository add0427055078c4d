"""A big job's heartbeats do not queue behind its row: each rank writes its own row, with its
own deadline, while another transaction holds the job's row (as a metrics batch moving the
job's step does until its commit). Real threads, each with its own PostgreSQL connection."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, connections

from breakers.agent.service import heartbeat_reply
from incidents.models import Job, JobRank
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

RANKS = 48


def beat(job_id: int, rank: int, step: int) -> None:
    body = {"step": step, "status": "running", "rank": rank, "world_size": RANKS}
    body |= {"pid": 5000 + rank, "hostname": f"gpu-{rank // 8}"}
    heartbeat_reply(job_id, json.dumps(body).encode())


def waiting_on_a_lock() -> bool:
    """Whether any other backend of this database waits for a lock (PostgreSQL's own view)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone() is not None


def hold_the_job_row(job_id: int, holding: threading.Event, release: threading.Event) -> None:
    """What a batch that moves the job's step holds from its UPDATE to its commit."""
    with connections["default"].cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute(
            f"UPDATE {Job._meta.db_table} SET current_step = current_step WHERE id = %s",
            [job_id],
        )
        holding.set()
        release.wait(120)
        cursor.execute("COMMIT")
    connections["default"].close()


def test_ranks_heartbeat_while_the_jobs_row_is_locked(agent):
    job_id = agent.job_id
    for step in (0, 10):  # first words (new ranks), then a measured step time: job-wide
        for rank in range(RANKS):
            beat(job_id, rank, step)
    beat(job_id, 0, 11)
    holding, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_the_job_row, args=(job_id, holding, release))
    holder.start()
    assert holding.wait(60)
    done: list[int] = []
    errors: list[BaseException] = []

    def one_rank(rank: int) -> None:
        try:
            beat(job_id, rank, 20)
            done.append(rank)
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)
        finally:
            connections["default"].close()

    threads = [threading.Thread(target=one_rank, args=(rank,)) for rank in range(1, RANKS)]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            lambda: len(done) + len(errors) == RANKS - 1,
            "every rank's heartbeat while the job's row is held",
            failed=lambda: "a heartbeat waits on a lock" if waiting_on_a_lock() else None,
        )
    finally:
        release.set()
        holder.join(60)
        for thread in threads:
            thread.join(60)
    assert not errors, errors
    seats = JobRank.objects.filter(job_id=job_id, rank__gte=1)
    assert sorted(seats.values_list("step", flat=True)) == [20] * (RANKS - 1)
    # The job's deadline is still never later than its earliest rank's: the watchdog's index.
    earliest = min(s.heartbeat_deadline for s in JobRank.objects.filter(job_id=job_id))
    assert Job.objects.get(pk=job_id).heartbeat_deadline <= earliest
