"""Celery beat runs every periodic task the system relies on, and each names a real task."""

import importlib

from celery import Task

from console.celery import app


def test_beat_schedules_the_watchdog_every_second_and_the_periodic_tasks():
    schedule = app.conf.beat_schedule
    assert schedule["watchdog"]["task"] == "control.watchdog"
    assert schedule["watchdog"]["schedule"] == 1.0
    assert schedule["breakers-tick-evaluations"]["task"] == "detection.tick_evaluations"
    assert schedule["expire-escalations"]["task"] == "escalations.expire"
    assert schedule["notification-rounds"]["task"] == "notifications.fire_due_rounds"
    app.loader.import_default_modules()  # what a worker does at start
    for entry in schedule.values():
        task = app.tasks[entry["task"]]
        assert isinstance(task, Task) and task.name == entry["task"]


def test_every_task_has_an_explicit_name_independent_of_its_module():
    """Queued messages, routes and the beat schedule name tasks; moving a module must not
    rename one. Celery's default name is the module path, so an explicit name differs."""
    app.loader.import_default_modules()
    ours = [t for name, t in app.tasks.items() if not name.startswith("celery.")]
    assert len(ours) >= 12
    for task in ours:
        assert not task.name.startswith(task.__module__), task.name


def test_the_task_modules_outside_autodiscovery_are_imported_by_workers():
    for module_name in app.conf.imports:
        importlib.import_module(module_name)
