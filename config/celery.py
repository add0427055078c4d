"""The Celery application. In the embedded mode tasks run in-process (CELERY_TASK_ALWAYS_EAGER)."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("brakeline")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Every domain package with Celery tasks keeps them in its tasks.py.
app.autodiscover_tasks(
    [
        "incidents.notifications",
        "breakers.detection",
        "breakers.control",
        "breakers.executors.slurm",
        "breakers.executors.traffic",
    ]
)
