"""The notification tasks as the services queue them: by their names, from Celery's registry.

The task module (``incidents.notifications.tasks``) is built on the services that queue its
tasks — a round schedules the next round, a delivery's fan-out queues the sending — so the
services reach the tasks by name rather than by importing it. ``IncidentsConfig.ready`` imports
the task module, so every process that loads the apps (Daphne, the worker, a management
command, the tests) has the tasks registered before anything is queued; an eager (embedded)
Celery runs them in-process as it would run an imported task.
"""

from __future__ import annotations

from celery import Task, current_app

DISPATCH_ALERT = "notifications.dispatch_alert"
FIRE_ROUND = "notifications.fire_round"
SEND_DELIVERY = "notifications.send_delivery"


def task(name: str) -> Task:
    """The registered task ``name`` (a KeyError names a task that was never registered)."""
    return current_app.tasks[name]
