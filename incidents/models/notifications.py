"""Notification models: a team's policy, people's contacts, escalation rounds, deliveries.

Imported at the end of ``incidents.models`` so Django registers them with this app.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from incidents.notifications.routing import DEFAULT_RULES

__all__ = [
    "ChatFormat",
    "Contact",
    "DELIVERY_TRANSITIONS",
    "Delivery",
    "DeliveryStatus",
    "DrillDelivery",
    "NotificationPolicy",
    "NotificationRound",
    "PageReply",
    "ROUND_TRANSITIONS",
    "RoundStatus",
]


def default_rules() -> list[dict]:
    return [dict(rule, channels=list(rule["channels"])) for rule in DEFAULT_RULES]


class ChatFormat(models.TextChoices):
    GENERIC = "generic", "Generic JSON"
    SLACK = "slack", "Slack-compatible"


class DrillDelivery(models.TextChoices):
    ON_CALL = "on_call", "The real people (on call)"
    RECEIVERS = "receivers", "The drill receivers"


class NotificationPolicy(models.Model):
    """How a team is reached: rules (layer, lowest level, channels), the chat webhook, and how
    long an alert may stay unacknowledged before the managers are paged (and again, and …)."""

    team = models.OneToOneField(
        "incidents.Team", on_delete=models.CASCADE, related_name="notification_policy"
    )
    rules = models.JSONField(default=default_rules)
    chat_webhook_url = models.URLField(max_length=500, blank=True)
    chat_format = models.CharField(
        max_length=8, choices=ChatFormat.choices, default=ChatFormat.SLACK
    )
    ack_timeout_seconds = models.PositiveIntegerField(default=300)
    # Alerts below this level are not escalated to managers (an L1 notice pages nobody).
    escalate_min_level = models.CharField(max_length=2, default="L2")
    max_rounds = models.PositiveIntegerField(default=10)
    # Whom a fire drill's page (an alert of a drill sandbox job) reaches: the real people, as
    # any alert does, or — so a drill need not wake the on-call — the receivers named here.
    drill_delivery = models.CharField(
        max_length=10, choices=DrillDelivery.choices, default=DrillDelivery.ON_CALL
    )
    drill_receivers = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="+")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"notification policy of {self.team}"


class Contact(models.Model):
    """Where a person is reached by SMS and phone (e-mail is the user's own address)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notify_contact"
    )
    phone = models.CharField(max_length=32, blank=True, help_text="E.164, e.g. +15551234567")

    def __str__(self) -> str:
        return f"{self.user}: {self.phone}"


class RoundStatus(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled"
    FIRED = "fired", "Fired"
    CANCELLED = "cancelled", "Cancelled"  # acknowledged, resolved or superseded first


ROUND_TRANSITIONS: dict[str, set[str]] = {
    RoundStatus.SCHEDULED: {RoundStatus.FIRED, RoundStatus.CANCELLED},
    RoundStatus.FIRED: set(),
    RoundStatus.CANCELLED: set(),
}


class NotificationRound(models.Model):
    """Round 0 pages the on-call person; round n ≥ 1 (due when nobody acknowledged in time)
    pages the team's managers. One row per (alert, level, round): redelivered tasks are no-ops."""

    alert = models.ForeignKey(
        "incidents.Alert", on_delete=models.CASCADE, related_name="notification_rounds"
    )
    severity = models.CharField(max_length=2)
    number = models.PositiveIntegerField()
    due_at = models.DateTimeField(db_index=True)
    status = models.CharField(
        max_length=10, choices=RoundStatus.choices, default=RoundStatus.SCHEDULED
    )
    fired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["alert", "severity", "number"], name="one_round_per_alert_level"
            )
        ]

    def __str__(self) -> str:
        return f"round {self.number} of alert {self.alert_id} {self.severity} ({self.status})"


class DeliveryStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    SENT = "sent", "Sent"  # the provider accepted it
    DELIVERED = "delivered", "Delivered"  # the provider (or receiving server) confirmed it
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"  # acknowledged before it went out


DELIVERY_TRANSITIONS: dict[str, set[str]] = {
    DeliveryStatus.QUEUED: {
        DeliveryStatus.SENT,
        DeliveryStatus.DELIVERED,
        DeliveryStatus.FAILED,
        DeliveryStatus.CANCELLED,
    },
    DeliveryStatus.SENT: {DeliveryStatus.DELIVERED, DeliveryStatus.FAILED},
    DeliveryStatus.DELIVERED: set(),
    DeliveryStatus.FAILED: set(),
    DeliveryStatus.CANCELLED: set(),
}
OPEN_DELIVERY_STATUSES = (DeliveryStatus.QUEUED,)


class Delivery(models.Model):
    """One message on one channel to one address. The rendered text is stored: the record says
    exactly what was sent. ``attempts`` doubles as the claim counter (compare-and-swap)."""

    team = models.ForeignKey("incidents.Team", on_delete=models.CASCADE, related_name="+")
    alert = models.ForeignKey(
        "incidents.Alert",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="deliveries",
    )
    round = models.ForeignKey(
        NotificationRound, on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    incident = models.ForeignKey(
        "incidents.Incident", on_delete=models.CASCADE, null=True, blank=True, related_name="+"
    )
    recipient = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    channel = models.CharField(max_length=8)
    address = models.CharField(max_length=500, blank=True)
    purpose = models.CharField(max_length=16, default="alert")  # alert / escalation / test / …
    first_line = models.CharField(max_length=300)
    body = models.TextField()
    status = models.CharField(
        max_length=10, choices=DeliveryStatus.choices, default=DeliveryStatus.QUEUED
    )
    attempts = models.PositiveIntegerField(default=0)
    # While queued: the moment by which a worker must have finished (or been handed) the next
    # attempt; past it, the sweeper re-queues the delivery (incidents.notifications.sweep).
    lease_until = models.DateTimeField(null=True, blank=True)
    provider_id = models.CharField(max_length=200, blank=True)
    # The short code an alert's page carries ("reply 1 K7Q2P"): with the address it was sent
    # to, it names this page in the person's reply (incidents.notifications.replies).
    reply_code = models.CharField(max_length=8, blank=True)
    provider_response = models.TextField(blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["alert", "status"], name="delivery_alert_status"),
            models.Index(fields=["team", "channel", "status"], name="delivery_team_channel"),
            models.Index(fields=["address", "reply_code"], name="delivery_reply"),
            # the sweeper's "queued, lease run out"
            models.Index(
                fields=["lease_until"],
                condition=models.Q(status="queued"),
                name="delivery_queued_lease",
            ),
        ]
        verbose_name_plural = "deliveries"

    def __str__(self) -> str:
        return f"{self.channel} to {self.address or '?'} ({self.status})"


class PageReply(models.Model):
    """One authenticated answer to a page (an SMS reply, a call's keypress, a chat link), kept
    so that the same signed request or one-time link is refused the second time: ``digest``
    is the SHA-256 of its signature (or link token), unique."""

    channel = models.CharField(max_length=8)
    digest = models.CharField(max_length=64, unique=True)
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="replies")
    received_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.channel} reply to delivery {self.delivery_id}"
