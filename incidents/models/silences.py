"""Silences (maintenance windows): a team's pages stop for a while; its brakes never do.

Imported at the end of ``incidents.models`` so Django registers them with this app.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from incidents.models.jobs import Job, Team

__all__ = ["Silence"]


class Silence(models.Model):
    """No page for the team's alerts (of one job, of one rule, or both) from ``starts_at`` to
    ``ends_at``. The alerts are still raised, braked, recorded and shown; only their
    notifications are held back. There is no status column: whether a silence applies is a
    matter of the clock alone, and ending one early moves ``ends_at`` to now."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="silences")
    job = models.ForeignKey(
        Job, on_delete=models.CASCADE, null=True, blank=True, related_name="silences"
    )
    rule_key = models.CharField(max_length=100, blank=True, help_text="Blank: every rule.")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, null=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    ended_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )

    class Meta:
        ordering = ["-starts_at", "-id"]
        constraints = [
            # Equal when a silence that had not started yet was ended: it never applies.
            models.CheckConstraint(
                condition=Q(ends_at__gte=F("starts_at")), name="silence_ends_after_it_starts"
            )
        ]
        indexes = [models.Index(fields=["team", "ends_at"], name="silence_team_ends")]

    def __str__(self) -> str:
        scope = self.job.name if self.job_id and self.job else "every job"
        rule = self.rule_key or "every rule"
        return (
            f"silence #{self.pk} of {self.team} ({scope}, {rule}) "
            f"until {self.ends_at:%Y-%m-%d %H:%M} UTC"
        )
