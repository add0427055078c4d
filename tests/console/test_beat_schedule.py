"""Celery beat runs every periodic task the system relies on, and each names a real task."""

from celery import Task

from config.celery import app
from config.schedule import PERIODIC


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


def test_the_embedded_ticker_runs_what_beat_runs():
    """One table: every interval task of beat's schedule is ticked in the embedded mode too."""
    ticked = {entry.task for entry in PERIODIC if entry.every}
    assert ticked == {
        entry["task"]
        for entry in app.conf.beat_schedule.values()
        if isinstance(entry["schedule"], float)
    }
