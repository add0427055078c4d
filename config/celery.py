"""The Celery application. In the embedded mode tasks run in-process (CELERY_TASK_ALWAYS_EAGER)."""

import os

from celery import Celery, signals

from config import broker

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Before any broker connection: a worker must survive Redis going away (config/broker.py).
broker.install()

app = Celery("brakeline")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Every domain package with Celery tasks keeps them in its tasks.py.
app.autodiscover_tasks(
    [
        "incidents.notifications",
        "breakers.detection",
        "breakers.storage",
        "breakers.pace",
        "breakers.drills",
        "breakers.control",
        "breakers.executors.slurm",
        "breakers.executors.traffic",
    ]
)


@signals.task_postrun.connect
def drop_broken_connections(**_: object) -> None:
    """A connection that failed (PostgreSQL restarted under it) is closed after its task.

    The worker keeps its connections across tasks (CELERY_DB_REUSE_MAX), so Celery's Django
    fixup no longer closes them per task; without this a connection cut by a database restart
    stayed in use, every task on it failed, and brakes waited about a minute after a restart
    (the fault suite's PostgreSQL row). A healthy connection is kept: only one whose last
    query failed and that no longer answers is closed (the pool then hands out a new one)."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        broken = connection.errors_occurred and not connection.is_usable()
        if connection.connection is not None and broken:
            connection.close()
