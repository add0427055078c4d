"""Which of a job's point ids a cursor may pass: every batch that could still commit below
them has ended.

A job's batches are written concurrently (ingest takes no lock that orders them), so a job's
point ids are not in commit order: a batch that took id 10 may commit after one that took
id 11. A cursor moved past 11 would skip 10 for ever. So the id-cursor readers (the evaluator,
the rollups; both walk ``points.next_chunk``) read only up to a **horizon** that no batch can
commit below any more:

- every ingest transaction announces itself first, before it takes any point id, with a
  *shared* advisory lock on its job (``announce_writer``), held until it commits or rolls
  back: shared, so a job's batches never wait for each other;
- a reader first reads the id sequence's last value ``h``, then takes and at once releases
  the *exclusive* lock on the job (``horizon``). It is granted only once every batch that
  held the shared lock by then has ended, which includes every batch that took an id ≤ h
  (it announced itself before taking it, and took it before ``h`` was read). A transaction's
  locks are released after its commit is visible, so every point of the job with an id ≤ h
  that will ever exist is visible to the reader's next statement.

Batches waiting to announce themselves queue behind the reader's brief exclusive request
(PostgreSQL grants locks in order), for as long as the batches already writing take to end:
milliseconds, once per chunk read, not once per batch. The embedded SQLite mode has one
writer at a time (its database lock), so ids are in commit order there and nothing is
capped.
"""

from __future__ import annotations

from functools import cache

from django.db import connection

from breakers.models import MetricPoint

# The advisory lock key of a job's writers: one 64-bit key space shared by nobody else; the job
# id in the low 48 bits (job ids stay far below 2⁴⁸), a fixed tag above it.
_TAG = 0x626B << 48  # "bk"


def _key(job_id: int) -> int:
    return _TAG | (job_id & ((1 << 48) - 1))


@cache
def _sequence() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [MetricPoint._meta.db_table])
        return cursor.fetchone()[0]


def announce_writer(job_id: int) -> None:
    """Inside an ingest transaction, before it takes any point id (PostgreSQL only)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [_key(job_id)])


def horizon(job_id: int) -> int | None:
    """The greatest point id a cursor of ``job_id`` may move to now (None: no cap, SQLite)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {_sequence()}")
        high = cursor.fetchone()[0]
        key = _key(job_id)
        cursor.execute("SELECT pg_advisory_lock(%s)", [key])
        cursor.execute("SELECT pg_advisory_unlock(%s)", [key])
    return int(high)
