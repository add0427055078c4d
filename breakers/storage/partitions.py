"""The compacted blocks' table is partitioned by day (UTC) of a block's first time.

Compaction creates the days a chunk's points fall on before it writes their blocks (there is no
default partition: a day is never created after rows of it landed somewhere else). Retention
drops a whole day once every block in it is past the raw window and none is in an incident's
freeze: no DELETE of millions of rows, no bloat left for vacuum. A day some freeze holds is
kept; retention's per-block DELETE empties it of everything else.
"""

from __future__ import annotations

import logging
from datetime import UTC, date, datetime, time, timedelta

from django.db import DatabaseError, connection, transaction

from breakers.models import MetricBlock

log = logging.getLogger(__name__)

BLOCKS = MetricBlock._meta.db_table
PREFIX = f"{BLOCKS}_p"
# The blocks table's columns as COPY writes them (binary), with their PostgreSQL types.
_BLOCK_COPY_TYPES = {
    "job_id": "int8",
    "rank": "int4",
    "node": "varchar",
    "first_step": "int8",
    "last_step": "int8",
    "first_time": "timestamptz",
    "last_time": "timestamptz",
    "last_id": "int8",
    "names": "varchar[]",
    "steps": "int8[]",
    "times": "timestamptz[]",
    "vals": "float8[]",
    "tdelta": "int4[]",
}
MAX_DAYS = 400  # days one chunk may touch: ingest keeps times within a day of the server's

_LIST_SQL = """
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = %s::regclass ORDER BY c.relname
"""


def name_of(day: date) -> str:
    return f"{PREFIX}{day:%Y%m%d}"


def day_of(name: str) -> date | None:
    try:
        return datetime.strptime(name.removeprefix(PREFIX), "%Y%m%d").date()
    except ValueError:
        return None  # not one of ours (an operator's own partition): never dropped


def existing() -> dict[date, str]:
    with connection.cursor() as cursor:
        cursor.execute(_LIST_SQL, [BLOCKS])
        names = [row[0] for row in cursor.fetchall()]
    return {day: name for name in names if (day := day_of(name)) is not None}


def _start(day: date) -> datetime:
    return datetime.combine(day, time(), tzinfo=UTC)


def ensure(first: datetime, last: datetime) -> None:
    """Create the day partitions from ``first``'s day to ``last``'s, each in a transaction of its
    own (brief: creating a partition locks the parent table)."""
    low, high = first.astimezone(UTC).date(), last.astimezone(UTC).date()
    if (high - low).days >= MAX_DAYS:
        raise ValueError(f"points span {low} … {high}: more than {MAX_DAYS} days in one chunk")
    have = existing()
    day = low
    while day <= high:
        if day not in have:
            _create(day)
        day += timedelta(days=1)


def _create(day: date) -> None:
    sql = (
        f'CREATE TABLE IF NOT EXISTS "{name_of(day)}" PARTITION OF {BLOCKS} '
        "FOR VALUES FROM (%s) TO (%s)"
    )
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, [_start(day), _start(day + timedelta(days=1))])
    except DatabaseError:
        # Two compactions creating the same day at once: IF NOT EXISTS does not cover the
        # race in the catalogue; the other's partition is as good as ours.
        if day not in existing():
            raise


def drop_expired(cutoff: datetime, frozen: str, freeze: dict) -> int:
    """Drop every day wholly before ``cutoff`` holding no block retention must keep (one past
    the window, or ``frozen``: retention's condition on a block ``b``); how many."""
    dropped = 0
    for day, table in existing().items():
        if _start(day + timedelta(days=1)) > cutoff:
            continue
        keeps = (
            f'SELECT EXISTS (SELECT 1 FROM "{table}" b WHERE b.last_time >= %(cutoff)s OR {frozen})'
        )
        with connection.cursor() as cursor:
            cursor.execute(keeps, {"cutoff": cutoff, **freeze})
            if cursor.fetchone()[0]:
                continue
        if _drop_unless_written(table, _newest_id(table)):
            log.info("retention: dropped the blocks of %s (%s)", day, table)
            dropped += 1
    return dropped


def _newest_id(table: str) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT max(id) FROM "{table}"')  # the partition's primary key index
        return cursor.fetchone()[0]


def _drop_unless_written(table: str, checked_up_to: int | None) -> bool:
    """Drop the partition unless a block landed in it since it was checked (a late compaction
    of frozen points, say). The parent's lock is taken first, as every reader takes it (the
    other order deadlocks with a reader), and only briefly: waiting readers and compactions
    resume once the partition is gone; a lock not had in 2 s leaves it to the next pass."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL lock_timeout = '2s'")
            cursor.execute(f"LOCK TABLE {BLOCKS} IN ACCESS EXCLUSIVE MODE")
            if _newest_id(table) != checked_up_to:
                return False
            cursor.execute(f'DROP TABLE "{table}"')
    except DatabaseError as error:
        log.info("retention: %s kept for now (%s)", table, error)
        return False
    return True


def copy_blocks(*, with_last_id: bool) -> tuple[str, list[str]]:
    """The COPY statement that writes blocks, and its column types. Ingest leaves ``last_id``
    to the column's default (the next id of the points' sequence); compaction, which packs
    points that already have ids, writes it."""
    columns = [c for c in _BLOCK_COPY_TYPES if with_last_id or c != "last_id"]
    sql = f"COPY {BLOCKS} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
    return sql, [_BLOCK_COPY_TYPES[c] for c in columns]
