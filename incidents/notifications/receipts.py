"""What happened to a delivery after it was sent: the provider's status callbacks (sent →
delivered / failed, with the incident's timeline row), and per channel when the team's last
delivery got through (the team page's status)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from core.transitions import compare_and_swap
from incidents.models import DELIVERY_TRANSITIONS, Delivery, DeliveryStatus
from incidents.notifications import senders as channels
from incidents.notifications.delivery import outcome_timeline

RECEIPT_OUTCOMES = {
    "delivered": DeliveryStatus.DELIVERED,
    "completed": DeliveryStatus.DELIVERED,  # a call that was answered
    "failed": DeliveryStatus.FAILED,
    "undelivered": DeliveryStatus.FAILED,
    "busy": DeliveryStatus.FAILED,
    "no-answer": DeliveryStatus.FAILED,
    "canceled": DeliveryStatus.FAILED,
}


def record_receipt(provider_id: str, provider_status: str, *, now: datetime | None = None) -> bool:
    """The provider's status callback: sent → delivered / failed, with its timeline row.
    False for an unknown id, an interim state (ringing, queued …) or a row already final."""
    outcome = RECEIPT_OUTCOMES.get(provider_status.lower())
    delivery = Delivery.objects.filter(provider_id=provider_id).exclude(provider_id="").first()
    if outcome is None or delivery is None:
        return False
    now = now or timezone.now()
    stamp = "delivered_at" if outcome == DeliveryStatus.DELIVERED else "failed_at"
    stamped: dict[str, Any] = {stamp: now}
    with transaction.atomic():
        won = compare_and_swap(
            Delivery,
            delivery.pk,
            table=DELIVERY_TRANSITIONS,
            expected=[DeliveryStatus.SENT],
            new=outcome,
            **stamped,
        )
        if won and delivery.incident_id is not None:
            outcome_timeline(delivery, outcome, delivery.latency_ms, now)
    return won


def last_delivered(team_id: int) -> dict[str, str | None]:
    """Per channel, when the team's last delivery got through (the team page's status)."""
    result: dict[str, str | None] = {}
    for channel in channels.ADAPTERS:
        last = (
            Delivery.objects.filter(
                team_id=team_id, channel=channel, status=DeliveryStatus.DELIVERED
            )
            .order_by("-delivered_at")
            .values_list("delivered_at", flat=True)
            .first()
        )
        result[channel] = last.isoformat() if last else None
    return result
