"""A node's beats in plain SQL: the job's row and its ranks' rows read in one statement, the
ranks' rows written in one compare-and-swap UPDATE (``incidents.heartbeats``). These two are
run for every node's bundle, and the ORM's building of them cost more than PostgreSQL's work
on them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from functools import cache
from typing import Any, TypeVar

from django.db import connection
from django.db.models import Field

from incidents.models import Job, JobRank

M = TypeVar("M", Job, JobRank)

# What a beat writes on its rank's row: all but the row's identity.
RANK_HEARTBEAT_FIELDS = tuple(
    f.attname for f in JobRank._meta.concrete_fields if f.name not in ("id", "job", "rank")
)


def job_and_seats(job_id: int, ranks: list[int]) -> tuple[Job, dict[int, JobRank]]:
    """The job and its rows of ``ranks`` in one statement (plain SQL: it is read for every
    node's beats, and the ORM's building of it cost more than the rest of the write)."""
    with connection.cursor() as cursor:
        cursor.execute(_read_sql(), [ranks, job_id])
        rows = cursor.fetchall()
    if not rows:
        raise Job.DoesNotExist(f"No job {job_id}.")
    split = len(Job._meta.concrete_fields)
    job = _from_row(Job, rows[0][:split])
    seats = [_from_row(JobRank, row[split:]) for row in rows if row[split] is not None]
    return job, {seat.rank: seat for seat in seats}


@cache
def _read_sql() -> str:
    columns = [f"j.{_quoted(f.column)}" for f in Job._meta.concrete_fields]
    columns += [f"r.{_quoted(f.column)}" for f in JobRank._meta.concrete_fields]
    return (
        f"SELECT {', '.join(columns)} FROM {Job._meta.db_table} AS j "
        f"LEFT JOIN {JobRank._meta.db_table} AS r ON r.job_id = j.id AND r.rank = ANY(%s) "
        "WHERE j.id = %s"
    )


def _quoted(column: str | None) -> str:
    return connection.ops.quote_name(str(column))


def _from_row(model: type[M], values: Sequence[Any]) -> M:
    fields = model._meta.concrete_fields
    if any(hasattr(field, "from_db_value") for field in fields):  # none of theirs, today
        values = [
            field.from_db_value(value, None, connection)
            if hasattr(field, "from_db_value")
            else value
            for field, value in zip(fields, values, strict=True)
        ]
    return model.from_db(connection.alias, _attnames(model), values)


@cache
def _attnames(model: type[Job] | type[JobRank]) -> list[str]:
    return [field.attname for field in model._meta.concrete_fields]


def write_seats(written: list[tuple[JobRank, datetime]]) -> set[int]:
    """The ranks' rows in one UPDATE, each only if its last heartbeat is still the one read
    (the compare-and-swap of ``_record_rank_alone``); the ranks written."""
    if not written:
        return set()
    head, row, tail = _write_sql()
    fields = _seat_fields()
    params: list[Any] = []
    for seat, previous in written:
        params += [seat.pk, previous]
        params += [
            field.get_db_prep_save(getattr(seat, field.attname), connection) for field in fields
        ]
    with connection.cursor() as cursor:
        cursor.execute(head + ", ".join([row] * len(written)) + tail, params)
        return {rank for (rank,) in cursor.fetchall()}


@cache
def _seat_fields() -> list[Field]:
    return [f for f in JobRank._meta.concrete_fields if f.attname in RANK_HEARTBEAT_FIELDS]


@cache
def _write_sql() -> tuple[str, str, str]:
    """The UPDATE of ``_write_seats`` around its VALUES rows, and one row's placeholders."""
    fields = _seat_fields()
    types = [JobRank._meta.pk.rel_db_type(connection), "timestamptz"]
    types += [field.db_type(connection) for field in fields]
    columns = [_quoted(field.column) for field in fields]
    head = (
        f"UPDATE {JobRank._meta.db_table} AS r SET "
        + ", ".join(f"{column} = v.{column}" for column in columns)
        + " FROM (VALUES "
    )
    row = "(" + ", ".join(f"%s::{kind}" for kind in types) + ")"
    tail = (
        f") AS v(id, previous, {', '.join(columns)})"
        " WHERE r.id = v.id AND r.last_heartbeat_at = v.previous RETURNING r.rank"
    )
    return head, row, tail
