"""Where a job runs and what the console did to its nodes through the scheduler.

``SchedulerBinding`` is the job's setting "which executor stops it": local process by default,
Slurm once its heartbeats report a ``SLURM_JOB_ID`` (or when an admin says so). ``NodeDrain`` is
a node taken out of the scheduler by Brakeline — by which alert, until which person returned it.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from incidents.models import Alert, Incident, Job, Node

__all__ = ["ExecutorKind", "NodeDrain", "SchedulerBinding"]


class ExecutorKind(models.TextChoices):
    LOCAL = "local", "Local process"
    SLURM = "slurm", "Slurm"


class SchedulerBinding(models.Model):
    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="scheduler_binding"
    )
    executor = models.CharField(
        max_length=16, choices=ExecutorKind.choices, default=ExecutorKind.LOCAL
    )
    executor_pinned = models.BooleanField(
        default=False,
        help_text="Chosen by a person: heartbeats no longer switch the executor automatically.",
    )
    requeue_after_drain = models.BooleanField(
        default=False,
        help_text="After draining a node of a job that is not being terminated (a manager's "
        "isolate_node), requeue the Slurm job so it restarts from its last checkpoint.",
    )
    slurm_job_id = models.CharField(max_length=32, blank=True)
    slurm_nodelist = models.CharField(max_length=1000, blank=True)
    slurm_step_id = models.CharField(max_length=32, blank=True)
    # The process that reported this context (a multi-node job has one per rank).
    hostname = models.CharField(max_length=255, blank=True)
    rank = models.IntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        where = f" job {self.slurm_job_id}" if self.slurm_job_id else ""
        return f"{self.job_id} via {self.executor}{where}"


class NodeDrain(models.Model):
    """One drain of a node by Brakeline: open until a manager returns the node to service."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="drains")
    slurm_node = models.CharField(max_length=200, help_text="The node's name in Slurm.")
    reason = models.CharField(max_length=300)
    alert = models.ForeignKey(
        Alert, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    incident = models.ForeignKey(
        Incident, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    command = models.ForeignKey(
        "breakers.Command", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    drained_at = models.DateTimeField()
    requeued_at = models.DateTimeField(null=True, blank=True)
    returned_at = models.DateTimeField(null=True, blank=True)
    returned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )

    class Meta:
        constraints = [
            # A second alert on a node already drained joins that drain: one record to return.
            models.UniqueConstraint(
                fields=["node"],
                condition=models.Q(returned_at__isnull=True),
                name="one_open_drain_per_node",
            )
        ]
        indexes = [models.Index(fields=["node", "drained_at"], name="node_drain_latest")]

    def __str__(self) -> str:
        state = "returned" if self.returned_at else "drained"
        return f"{self.slurm_node} {state} ({self.reason})"
