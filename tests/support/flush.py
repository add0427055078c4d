"""The flush after every transactional test, at the cost of the rows the test left.

Django empties the database after a transactional test with one ``TRUNCATE`` of every table
(seventy-odd here). PostgreSQL truncates a table by giving it, its indexes and its TOAST table
new files, whether it holds rows or not: about a second per test on a loaded CI machine, for
tests that mostly wrote to a handful of tables. Here only the tables that hold rows are
emptied, with ``DELETE`` (a few rows: no files) inside the flush's own transaction. These are
still truncated, as Django would: a table whose own triggers act on a delete (the append-only
timeline, audit trail, review revisions and rule-set versions refuse it) and a table of many
rows (no dead tuples left for the next test to scan); ``CASCADE`` takes the tables that point
at them along. The database is as empty afterwards as after Django's flush, the sequences go
on as they do there, and Django then sends post_migrate as it does after its own. Content
types and permissions, which that signal would create again row by row, are left as they
are: the rows of the migrated models, the same after every test (no test writes any).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.db import OperationalError, transaction
from django.db.backends.postgresql.operations import DatabaseOperations
from psycopg.errors import DeadlockDetected

# From this many rows a table is truncated rather than deleted from.
MANY_ROWS = 5_000

# Another writer (a web process, a task still finishing) may lock rows in another order: the
# deadlock PostgreSQL then breaks costs the flush a new attempt, not the test.
ATTEMPTS = 5

# What post_migrate would write again at once, unchanged since the migrations.
KEPT = frozenset({"django_content_type", "auth_permission"})

# Tables with a trigger of their own that fires on DELETE (tgtype bit 3, TRIGGER_TYPE_DELETE).
DELETE_TRIGGERS = """
    SELECT DISTINCT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    WHERE NOT t.tgisinternal AND t.tgtype & 8 <> 0
"""


def _rows(cursor: Any, quote: Callable[[str], str], tables: list[str]) -> dict[str, int]:
    """Each table that holds rows, with their number (counted up to MANY_ROWS)."""
    counts = " UNION ALL ".join(
        f"SELECT %s, (SELECT count(*) FROM (SELECT 1 FROM {quote(table)} LIMIT {MANY_ROWS}) s)"
        for table in tables
    )
    cursor.execute(counts, tables)
    return {table: count for table, count in cursor.fetchall() if count}


def empty_tables(ops: DatabaseOperations, sql_list: Sequence[str]) -> None:
    """``execute_sql_flush`` for the flush between tests: the tables Django would truncate
    are empty afterwards (any other flush, one that resets sequences, is Django's own)."""
    plain = len(sql_list) == 1 and sql_list[0].startswith("TRUNCATE ")
    if not plain or "RESTART IDENTITY" in sql_list[0] or " CASCADE" in sql_list[0]:
        _django_flush(ops, sql_list)
        return
    connection, quote = ops.connection, ops.quote_name
    tables = [
        table
        for table in connection.introspection.django_table_names(
            only_existing=True, include_views=False
        )
        if table not in KEPT
    ]
    for attempt in range(ATTEMPTS):
        try:
            _empty(connection, quote, tables)
            return
        except OperationalError as error:
            if not isinstance(error.__cause__, DeadlockDetected) or attempt == ATTEMPTS - 1:
                raise


def _empty(connection: Any, quote: Callable[[str], str], tables: list[str]) -> None:
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL DEFERRED")
        # The web processes' hearing beacon (breakers.control.hearing) locks this row first
        # and then writes other tables: taken first here too, a flush waits for a beacon or a
        # beacon for the flush, never each for the other.
        cursor.execute("SELECT 1 FROM breakers_hearing FOR UPDATE")
        rows = _rows(cursor, quote, tables)
        cursor.execute(DELETE_TRIGGERS)
        triggered = {name for (name,) in cursor.fetchall()}
        truncated = [t for t, count in rows.items() if t in triggered or count >= MANY_ROWS]
        if truncated:  # first: a table with pending trigger events cannot be truncated
            cursor.execute(f"TRUNCATE {', '.join(map(quote, truncated))} CASCADE")
        # Foreign keys are checked at commit (deferred above; Django's are DEFERRABLE): any
        # order of deletes leaves no dangling reference by then.
        for table in rows.keys() - set(truncated):
            cursor.execute(f"DELETE FROM {quote(table)}")


_django_flush = DatabaseOperations.execute_sql_flush


def install() -> None:
    """Every flush of this process goes through ``empty_tables``."""
    DatabaseOperations.execute_sql_flush = empty_tables  # type: ignore[method-assign]
