"""Automatic recoveries after an L3 brake: the verdict recorded before it is acted on, and
where acting on it stands (docs/recovery.md). The breakers decide and act
(``breakers.recovery``); the incident page and the review read these rows.

Imported at the end of ``incidents.models`` so Django registers them with the app.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from incidents.models.alerts import Alert, Incident
from incidents.models.jobs import Job

__all__ = [
    "OPEN_RECOVERY_STATUSES",
    "RECOVERY_TRANSITIONS",
    "Recovery",
    "RecoveryStatus",
    "RecoveryVerdict",
]


class RecoveryVerdict(models.TextChoices):
    RECOVER = "recover", "Recover: roll back, skip, resume"
    STOP_AND_PAGE = "stop_and_page", "Stop and page"
    ISOLATE_AND_PAGE = "isolate_and_page", "Isolate the node and page"
    HOLD = "hold", "Hold for a person"


class RecoveryStatus(models.TextChoices):
    DECIDED = "decided", "Verdict recorded"  # not acted on yet
    ROLLING_BACK = "rolling_back", "Roll back requested"
    RECOVERED = "recovered", "Rolled back and resumed"
    FAILED = "failed", "Roll back failed"  # the job refused or could not resume
    HELD = "held", "Held for a person"  # the verdict was not to recover
    TAKEN_OVER = "taken_over", "Taken over by a person"


RECOVERY_TRANSITIONS: dict[str, set[str]] = {
    RecoveryStatus.DECIDED: {
        RecoveryStatus.ROLLING_BACK,
        RecoveryStatus.HELD,
        RecoveryStatus.FAILED,
        RecoveryStatus.TAKEN_OVER,
    },
    RecoveryStatus.ROLLING_BACK: {
        RecoveryStatus.RECOVERED,
        RecoveryStatus.FAILED,
        RecoveryStatus.TAKEN_OVER,
    },
    RecoveryStatus.RECOVERED: set(),
    RecoveryStatus.FAILED: set(),
    RecoveryStatus.HELD: set(),
    RecoveryStatus.TAKEN_OVER: set(),
}
OPEN_RECOVERY_STATUSES = (RecoveryStatus.DECIDED, RecoveryStatus.ROLLING_BACK)


class Recovery(models.Model):
    """One automatic L3 brake's verdict (one per brake: ``pause_command_id``) and, when it
    says recover, the roll back that carries it out. Commands are the breakers' rows: they
    are named by id, as this layer does not import them."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="recoveries")
    incident = models.ForeignKey(Incident, on_delete=models.PROTECT, related_name="recoveries")
    alert = models.ForeignKey(
        Alert, on_delete=models.PROTECT, null=True, blank=True, related_name="recoveries"
    )
    pause_command_id = models.BigIntegerField(unique=True)
    rule_key = models.CharField(max_length=100)
    cause = models.CharField(max_length=100, help_text="The rule's runbook entry, else its key.")
    first_step = models.BigIntegerField(help_text="The offending window's first step.")
    last_step = models.BigIntegerField(help_text="The step the brake held at.")
    rank = models.IntegerField(null=True, blank=True)
    node = models.CharField(max_length=200, blank=True)
    verdict = models.CharField(max_length=20, choices=RecoveryVerdict.choices)
    reasons = models.JSONField(default=list)
    evidence = models.JSONField(default=dict)
    status = models.CharField(
        max_length=16, choices=RecoveryStatus.choices, default=RecoveryStatus.DECIDED
    )
    decided_at = models.DateTimeField()
    checkpoint_id = models.BigIntegerField(null=True, blank=True)
    checkpoint_step = models.BigIntegerField(null=True, blank=True)
    skip_steps = models.JSONField(default=list, blank=True)
    resume_command_id = models.BigIntegerField(null=True, blank=True, unique=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    taken_over_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )

    class Meta:
        indexes = [models.Index(fields=["job", "decided_at"], name="recovery_job_decided")]
        ordering = ["decided_at", "pk"]

    def __str__(self) -> str:
        return f"recovery #{self.pk} of job {self.job_id}: {self.verdict} ({self.status})"
