"""The Celery application. In the embedded mode tasks run in-process (CELERY_TASK_ALWAYS_EAGER)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("brakeline")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["incidents", "breakers", "console"])
# Task modules not named tasks.py, which autodiscovery would miss.
app.conf.imports = ["breakers.control_tasks", "breakers.slurm_tasks"]
