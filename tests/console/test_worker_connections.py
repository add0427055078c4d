"""The production worker shape (prefork pool) keeps its PostgreSQL connections across tasks.

Celery's Django fixup closes every connection, and under prefork the whole psycopg pool,
before and after each task unless CELERY_DB_REUSE_MAX is set: two new connections per task.
Counted with PostgreSQL's own session counter (pg_stat_database.sessions), not timed.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from django.db import connection

from tests.conftest import server_environment

pytestmark = pytest.mark.django_db(transaction=True)

TASKS = 40


def sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        return int(cursor.fetchone()[0])


def wait_until_done(app, count: int, deadline: float) -> None:
    """Until the worker has taken ``count`` watchdog tasks and runs none: its own counters,
    asked over Celery's remote control (an event, not a guessed time)."""
    while time.monotonic() < deadline:
        inspect = app.control.inspect(timeout=1)
        stats, active = inspect.stats() or {}, inspect.active() or {}
        taken = sum(s.get("total", {}).get("control.watchdog", 0) for s in stats.values())
        if stats and taken >= count and not any(active.values()):
            return
        time.sleep(0.2)
    raise AssertionError(f"the worker did not run {count} watchdog tasks in time")


def test_a_prefork_worker_does_not_reconnect_for_every_task(settings):
    from config.celery import app

    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            "1",
            "-Q",
            f"{queue}-watchdog,{queue},{queue}-ticks",
            "--loglevel",
            "warning",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        env=server_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        app.send_task("control.watchdog", kwargs={})  # the warm-up: the pool's connections open
        wait_until_done(app, 1, deadline)
        before = sessions()
        for _ in range(TASKS):
            app.send_task("control.watchdog", kwargs={}, expires=600)
        wait_until_done(app, 1 + TASKS, deadline)
        opened = sessions() - before
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    # Without DB_REUSE_MAX this is ~2 per task (80); a handful covers the pool's own refills.
    assert opened <= 10, f"{opened} new PostgreSQL sessions for {TASKS} tasks"
