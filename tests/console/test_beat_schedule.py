"""Celery beat runs every periodic task the system relies on, and each names a real task."""

import importlib

from celery import Task

from console.celery import app


def test_beat_schedules_the_watchdog_every_second_and_the_periodic_tasks():
    schedule = app.conf.beat_schedule
    assert schedule["watchdog"]["task"] == "breakers.control_tasks.watchdog"
    assert schedule["watchdog"]["schedule"] == 1.0
    assert schedule["breakers-tick-evaluations"]["task"] == "breakers.tasks.tick_evaluations"
    assert schedule["expire-escalations"]["task"] == "console.tasks.expire_escalations"
    assert schedule["notification-rounds"]["task"] == "incidents.tasks.fire_due_rounds_task"
    for entry in schedule.values():
        module_name, _, function = entry["task"].rpartition(".")
        task = getattr(importlib.import_module(module_name), function)
        assert isinstance(task, Task) and task.name == entry["task"]


def test_the_task_modules_outside_autodiscovery_are_imported_by_workers():
    for module_name in app.conf.imports:
        importlib.import_module(module_name)
