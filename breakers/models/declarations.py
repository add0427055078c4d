"""What the console knows is a job's, declared through a trusted path, never by its agent.

An executor acts only on these (``breakers.executors.targets``):

- ``InferenceServer``: a load balancer's backend/server that serves an inference job, declared
  by a team admin (API, admin). A server serves one job of one team: the pair is unique.
- ``CheckpointRoot``: the folder (or object-store prefix) under which a team's checkpoints, or
  one job's, must live; declared by a team admin. The job's own root wins over its team's.
- ``NodeBinding``: a node bound to a job by an operator (the node inventory) or by the
  scheduler's own answer. A node an agent merely named stays "reported, unverified".
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from incidents.models import Job, Team

__all__ = ["BindingSource", "CheckpointRoot", "InferenceServer", "NodeBinding"]


class InferenceServer(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="inference_servers")
    backend = models.CharField(max_length=100, help_text="The load balancer's backend.")
    server = models.CharField(max_length=100, help_text="The server's name in that backend.")
    declared_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    declared_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["backend", "server"], name="inference_server_once"),
        ]
        ordering = ["job_id", "backend", "server"]

    def __str__(self) -> str:
        return f"{self.backend}/{self.server} (job {self.job_id})"


class CheckpointRoot(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="checkpoint_roots")
    job = models.OneToOneField(
        Job, null=True, blank=True, on_delete=models.CASCADE, related_name="checkpoint_root"
    )
    root = models.CharField(
        max_length=1000,
        help_text="An absolute folder (/data/team-a/checkpoints) or a declared object-store "
        "prefix (s3://team-a-checkpoints/); every catalogue entry must live under it.",
    )
    declared_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    declared_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["team"], condition=models.Q(job__isnull=True), name="one_team_root"
            ),
        ]

    def __str__(self) -> str:
        whose = f"job {self.job_id}" if self.job_id else f"team {self.team_id}"
        return f"{self.root} ({whose})"


class BindingSource(models.TextChoices):
    OPERATOR = "operator", "Operator (node inventory)"
    SCHEDULER = "scheduler", "Scheduler's own answer"


class NodeBinding(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="node_bindings")
    hostname = models.CharField(max_length=200)
    source = models.CharField(max_length=16, choices=BindingSource.choices)
    declared_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    declared_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "hostname"], name="node_binding_once"),
        ]

    def __str__(self) -> str:
        return f"{self.hostname} bound to job {self.job_id} by the {self.source}"
