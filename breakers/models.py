"""Metric points streamed by training processes."""

from __future__ import annotations

from django.db import models

from breakers.fields import NonFiniteFloatField
from incidents.models import Job


class MetricPoint(models.Model):
    """One value of one metric at one training step.

    Written in bulk by ``breakers.ingest`` (one ``COPY`` per batch on PostgreSQL), never one
    ORM save per point. ``id`` grows in commit order within a job because ingest of one job is
    serialised by a row lock on the job, so the evaluator can use it as its cursor.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=200)
    step = models.BigIntegerField()
    time = models.DateTimeField()
    value = NonFiniteFloatField()
    node = models.CharField(max_length=200, null=True, blank=True)

    class Meta:
        indexes = [
            # "the last W points of metric M of job J" and step ranges of one series
            models.Index(fields=["job", "name", "step"], name="metric_series_step"),
            # time ranges of one series (charts by time, silence checks)
            models.Index(fields=["job", "name", "time"], name="metric_series_time"),
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.step}={self.value}"


# Control-plane models live in their own module (commands to jobs); imported here so Django
# registers them with this app.
from breakers.control_models import Command  # noqa: E402, F401
