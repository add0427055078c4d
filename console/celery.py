"""The Celery application. In the embedded mode tasks run in-process (CELERY_TASK_ALWAYS_EAGER)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("brakeline")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["incidents", "breakers", "console"])
# Task modules not named tasks.py, which autodiscovery would miss.
app.conf.imports = ["breakers.control_tasks"]

# The watchdog for jobs (heartbeats, unacknowledged commands) runs every second; its own
# last run is what /api/v1/health reports as the beat's age.
app.conf.beat_schedule = {
    "watchdog": {"task": "breakers.control_tasks.watchdog", "schedule": 1.0},
}
