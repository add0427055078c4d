"""Versions of a team's rule set: one immutable row per change."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from core.append_only import AppendOnlyModel, AppendOnlyQuerySet
from incidents.models import Team

__all__ = ["RuleSetVersion"]


class RuleSetVersion(AppendOnlyModel):
    """The rules a team's jobs were braked by from ``created_at`` on: who changed what, why,
    the diff against the previous version and the canonical snapshot of the whole set.

    Written only by ``breakers.detection.rulesets`` (under the team's row lock, so numbers are
    1, 2, 3… per team without gaps). Append-only three times over, like the audit trail: the
    model, its queryset and, on PostgreSQL, a trigger (migration 0015) refuse UPDATE and
    DELETE. Hence PROTECT on both foreign keys: nulling a column would be an UPDATE.
    """

    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="ruleset_versions")
    number = models.PositiveIntegerField()
    created_at = models.DateTimeField()
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        help_text="Empty: the system (a change made outside the console, found and recorded).",
    )
    why = models.TextField()
    summary = models.CharField(max_length=300)
    diff = models.JSONField(default=list)  # breakers.detection.ruleset_core.diff
    snapshot = models.JSONField()  # ruleset_core.snapshot: rules by key, braking settings
    fingerprint = models.CharField(max_length=64)  # sha256 of the snapshot's canonical JSON

    append_only_noun = "Rule set versions"
    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "number"], name="ruleset_version_once"),
        ]
        ordering = ["team", "-number"]

    def __str__(self) -> str:
        return f"{self.team_id} v{self.number}: {self.summary}"
