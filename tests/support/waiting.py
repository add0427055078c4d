"""Polling until something holds: one ``wait_for`` for the whole suite."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    what: str,
    timeout: float = 60.0,
    *,
    interval: float = 0.02,
    failed: Callable[[], str | None] | None = None,
    context: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that.

    ``what`` names the awaited thing in the failure. ``failed`` is asked on every round: a
    sentence ("train_torch exited with 1": waiting is pointless) fails at once, None goes on.
    What ``context`` returns (a log's tail) is added to either failure.
    """

    def failure(reason: str) -> AssertionError:
        tail = f"\n{context()}" if context is not None else ""
        return AssertionError(f"{reason} for {what}{tail}")

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        reason = failed() if failed is not None else None
        if reason is not None:
            raise failure(f"{reason} while waiting")
        time.sleep(interval)
    raise failure(f"still waiting after {timeout:.0f} s")


def backend_pid() -> int:
    """The PostgreSQL backend of this thread's connection (for ``waits_on_a_lock``)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def waits_on_a_lock(pid: int | None) -> bool:
    """Whether backend ``pid`` is waiting for a lock, by PostgreSQL's own view: the race tests
    wait on this, never on a timer."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", [pid]
        )
        return cursor.fetchone() is not None
