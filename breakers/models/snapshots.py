"""Environment snapshots sent by training processes (docs/design.md "Environment snapshots").

A snapshot is taken by the agent at start and at each checkpoint: package versions, selected
environment variables (secrets redacted by the agent), seeds, git commit, container image,
resource limits, data-loader position. The console stores the document as the agent sent it
(after ``breakers.snapshots.intake`` validated it) so two snapshots can be diffed and the sandbox
graded from it; the few fields a query needs (kind, step, time, checkpoint) are columns.
"""

from __future__ import annotations

from django.db import models

from incidents.models import Job

__all__ = ["KINDS_WITH_CHECKPOINT", "EnvironmentSnapshot", "SnapshotKind"]


class SnapshotKind(models.TextChoices):
    START = "start", "At start"
    CHECKPOINT = "checkpoint", "At a checkpoint"
    # After a run resumed from a checkpoint (a pause ended, or a new process restored it):
    # checkpoint_path/sha256 name the checkpoint it resumed from, whose snapshot it is diffed
    # against (breakers.snapshots.resume).
    RESUME = "resume", "After a resume"


# Kinds that name a checkpoint: the one written, or the one resumed from.
KINDS_WITH_CHECKPOINT = (SnapshotKind.CHECKPOINT, SnapshotKind.RESUME)


class EnvironmentSnapshot(models.Model):
    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="snapshots")
    kind = models.CharField(max_length=16, choices=SnapshotKind.choices)
    step = models.BigIntegerField()
    taken_at = models.DateTimeField(help_text="When the agent took it (server time if not sent).")
    received_at = models.DateTimeField(auto_now_add=True)
    data = models.JSONField(help_text="The snapshot document, as validated.")
    # Set for kind=checkpoint: which checkpoint this environment belongs to, so "metrics differ
    # after resume" can be traced from the checkpoint a run resumed from to its environment.
    checkpoint_path = models.CharField(max_length=4096, blank=True)
    checkpoint_sha256 = models.CharField(max_length=64, blank=True)

    class Meta:
        constraints = [
            # The agent retries a snapshot whose answer it did not get; the same document
            # (same kind, step and time of taking) is then the same row, not a second one.
            models.UniqueConstraint(
                fields=["job", "kind", "step", "taken_at"], name="snapshot_once"
            ),
        ]
        indexes = [models.Index(fields=["job", "taken_at"], name="snapshot_job_time")]
        ordering = ["job_id", "taken_at", "pk"]

    def __str__(self) -> str:
        return f"{self.kind} snapshot of job {self.job_id} at step {self.step}"
