"""What a rule in shadow mode (observe only) would have done: one row per episode."""

from __future__ import annotations

from django.db import models

from core.fields import NonFiniteFloatField
from incidents.models import Job

__all__ = ["ShadowFiring"]


class ShadowFiring(models.Model):
    """One episode of a shadow rule on one job: the alert it would have raised (level, action,
    at which step, rank and time) and when its condition cleared.

    Bounded like alerts: one row per (job, rule, node) episode, not per point. While the
    episode is open (``cleared_at`` NULL, at most one such row per fingerprint) further
    findings of the same rule and node only widen it (``ranks``, ``last_step``, ``level`` of
    the latest finding). Written only by ``breakers.detection.shadow``, inside the evaluation
    transaction that judged the points, so a re-delivered evaluation never records it twice.
    """

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="shadow_firings")
    rule_key = models.CharField(max_length=100)
    rule_name = models.CharField(max_length=200)
    node = models.CharField(max_length=200, blank=True)  # "" when the rule pools the nodes
    severity = models.CharField(max_length=2)
    layer = models.CharField(max_length=16)
    action = models.CharField(max_length=32)  # what the brake would have asked for
    metric = models.CharField(max_length=200)
    ranks = models.JSONField(default=list, blank=True)  # the ranks whose series fired
    value = NonFiniteFloatField()
    threshold = models.FloatField(null=True, blank=True)
    description = models.TextField()
    first_step = models.BigIntegerField(help_text="First anomalous point of the episode.")
    first_time = models.DateTimeField()
    fired_step = models.BigIntegerField(help_text="Where the alert would have been raised.")
    fired_at = models.DateTimeField(help_text="When, on the job's metric clock.")
    last_step = models.BigIntegerField()
    findings = models.PositiveIntegerField(default=1)  # fire findings folded into this row
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_step = models.BigIntegerField(null=True, blank=True)
    cleared_reason = models.CharField(max_length=300, blank=True)
    recorded_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "rule_key", "node"],
                condition=models.Q(cleared_at__isnull=True),
                name="one_open_shadow_firing",
            )
        ]
        indexes = [
            models.Index(fields=["rule_key", "fired_at"], name="shadow_rule_fired"),
            models.Index(fields=["job", "fired_at"], name="shadow_job_fired"),
        ]
        ordering = ["-fired_at", "-id"]

    def __str__(self) -> str:
        return f"{self.rule_key} would have fired on job {self.job_id} at step {self.fired_step}"
