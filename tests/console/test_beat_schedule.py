"""Celery beat runs every periodic task the system relies on."""

from console.celery import app


def test_beat_schedules_the_watchdog_every_second_and_the_evaluation_tick():
    app.loader.import_default_modules()  # what a worker or beat does at start-up
    schedule = app.conf.beat_schedule
    assert schedule["watchdog"]["task"] == "breakers.control_tasks.watchdog"
    assert schedule["watchdog"]["schedule"] == 1.0
    assert schedule["breakers-tick-evaluations"]["task"] == "breakers.tasks.tick_evaluations"
    for entry in schedule.values():
        assert entry["task"] in app.tasks, f"{entry['task']} is not a registered task"
