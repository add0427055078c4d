"""What the cluster's monitoring told Brakeline (docs/monitoring.md).

``IntegrationToken``: a team's token for Alertmanager's webhook (one team per token, so an
alert can only ever reach that team's jobs). ``ExternalAlert``: one Alertmanager alert, by its
fingerprint, from firing to resolved; routed to a job (and the Brakeline alert it feeds) or
kept unrouted — never dropped.
"""

from __future__ import annotations

import secrets

from django.db import models

from incidents.models import Alert, Job, Team, hash_token

__all__ = [
    "EXTERNAL_ALERT_TRANSITIONS",
    "ExternalAlert",
    "ExternalAlertStatus",
    "IntegrationToken",
]

INTEGRATION_TOKEN_PREFIX = "bki_"


class IntegrationToken(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="integration_tokens")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name}) for {self.team}"

    @classmethod
    def issue(cls, team: Team, name: str) -> tuple[IntegrationToken, str]:
        """A new token; the raw token is returned once and never stored (sha256, as agent
        tokens: 256 random bits leave no dictionary to attack)."""
        raw = INTEGRATION_TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            team=team, name=name, token_hash=hash_token(raw), prefix=raw[:12]
        )
        return token, raw


class ExternalAlertStatus(models.TextChoices):
    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"


EXTERNAL_ALERT_TRANSITIONS: dict[str, set[str]] = {
    ExternalAlertStatus.FIRING: {ExternalAlertStatus.RESOLVED},
    ExternalAlertStatus.RESOLVED: set(),
}


class ExternalAlert(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="external_alerts")
    source = models.CharField(max_length=32, default="alertmanager")
    fingerprint = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=ExternalAlertStatus.choices, default=ExternalAlertStatus.FIRING
    )
    alertname = models.CharField(max_length=200)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict)
    group_key = models.TextField(blank=True)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField(null=True, blank=True)
    node = models.CharField(max_length=200, blank=True, help_text="The node its labels name.")
    level = models.CharField(max_length=2)
    why = models.CharField(max_length=300, blank=True, help_text="What decided the level.")
    job = models.ForeignKey(
        Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="external_alerts"
    )
    alert = models.ForeignKey(
        Alert, null=True, blank=True, on_delete=models.SET_NULL, related_name="external_alerts"
    )
    unrouted_reason = models.CharField(max_length=300, blank=True)
    received_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    repeats = models.IntegerField(default=0, help_text="Deliveries of the same firing alert.")
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Alertmanager repeats a firing alert every repeat_interval, and an HA pair sends
            # it twice: one row per firing episode of a fingerprint.
            models.UniqueConstraint(
                fields=["team", "fingerprint"],
                condition=models.Q(status="firing"),
                name="one_firing_external_alert",
            )
        ]
        indexes = [
            models.Index(fields=["team", "status", "job"], name="external_alert_routing"),
            # A replay of a resolved episode is found by its fingerprint and start.
            models.Index(
                fields=["team", "fingerprint", "starts_at"], name="external_alert_episode"
            ),
            models.Index(fields=["alert", "status"], name="external_alert_feeds"),
        ]

    def __str__(self) -> str:
        return f"{self.alertname} {self.node or '-'} ({self.status})"
