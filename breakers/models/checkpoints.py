"""The checkpoint catalogue: every checkpoint a job reported (docs/design.md "Roll back").

A checkpoint is reported by the agent when it is written (``POST /api/v1/agent/checkpoints``)
and, for a brake, in the acknowledgement of ``checkpoint_and_pause``; both land on the same row
(path and hash are its identity). Whether a checkpoint is *clean* is not stored: it depends on
the incident it is looked at from (its weights must hold no update from the incident's first
anomalous step on), see ``breakers.checkpoints``.
"""

from __future__ import annotations

from django.db import models

from incidents.models import Job

__all__ = ["Checkpoint", "CheckpointReason", "CheckpointSet"]


class CheckpointReason(models.TextChoices):
    BRAKE = "brake", "Taken by the brake (checkpoint_and_pause)"
    MANUAL = "manual", "Taken by the training script"
    FRAMEWORK = "framework", "Written by the framework"


class Checkpoint(models.Model):
    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    path = models.CharField(max_length=4096)
    sha256 = models.CharField(max_length=64)
    step = models.BigIntegerField()
    # The last step whose optimizer update the weights hold (the SDK's step guard knows it);
    # NULL: not known, then ``step`` is taken.
    weights_step = models.BigIntegerField(null=True, blank=True)
    rank = models.IntegerField(default=0)
    bytes = models.BigIntegerField(null=True, blank=True)
    reason = models.CharField(max_length=16, choices=CheckpointReason.choices)
    command_id = models.BigIntegerField(null=True, blank=True)  # the brake's command, if any
    # The set this rank's file belongs to (multi-rank jobs); NULL: a lone file.
    checkpoint_set = models.ForeignKey(
        "CheckpointSet", null=True, blank=True, on_delete=models.SET_NULL, related_name="files"
    )
    reported_at = models.DateTimeField()

    class Meta:
        ordering = ["-step", "-id"]
        constraints = [
            # The ack and the report of one brake, or a retried report: one row.
            models.UniqueConstraint(fields=["job", "path", "sha256"], name="checkpoint_once")
        ]
        indexes = [models.Index(fields=["job", "step"], name="checkpoint_job_step")]

    def __str__(self) -> str:
        return f"checkpoint of job {self.job_id} at step {self.step} ({self.sha256[:12]})"

    @property
    def holds_updates_through(self) -> int:
        return self.step if self.weights_step is None else self.weights_step


class CheckpointSet(models.Model):
    """One checkpoint of a multi-rank job: the manifest rank 0 wrote once every rank's file was
    durable (step, world size, each rank's path, bytes and SHA-256). Only complete sets are
    stored (``breakers.checkpoints.parse_set``): every rank from 0 to ``world_size - 1`` has
    exactly one shard, so a catalogue of sets never offers a roll back missing a rank."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoint_sets")
    step = models.BigIntegerField()
    world_size = models.IntegerField()
    manifest_path = models.CharField(max_length=4096)
    manifest_sha256 = models.CharField(max_length=64)
    # [{"rank", "path", "bytes", "sha256"}, ...] in rank order, all world_size of them.
    shards = models.JSONField()
    reported_at = models.DateTimeField()

    class Meta:
        ordering = ["-step", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "manifest_path", "manifest_sha256"], name="checkpoint_set_once"
            )
        ]

    def __str__(self) -> str:
        return f"checkpoint set of job {self.job_id} at step {self.step} ({self.world_size} ranks)"
