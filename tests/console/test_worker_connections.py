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
        warm = app.send_task("control.watchdog", kwargs={})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and app.control.inspect(timeout=1).active() is None:
            time.sleep(0.5)
        time.sleep(2)  # the warm-up task has run: its connections are open now
        before = sessions()
        for _ in range(TASKS):
            app.send_task("control.watchdog", kwargs={}, expires=600)
        # Wait on the queue draining (an event), not a fixed time.
        import redis

        broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        while time.monotonic() < deadline and broker.llen(f"{queue}-watchdog"):
            time.sleep(0.2)
        time.sleep(1)
        opened = sessions() - before
        del warm
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    # Without DB_REUSE_MAX this is ~2 per task (80); a handful covers the pool's own refills.
    assert opened <= 10, f"{opened} new PostgreSQL sessions for {TASKS} tasks"
