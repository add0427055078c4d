"""Sending one delivery, and stopping an alert's pages once it no longer pages.

A queued delivery holds a lease (``lease_until``): its task must claim it, and a claimed
attempt must be finished, before the lease runs out. A worker SIGKILLed mid-send leaves its
row queued with a claimed attempt that nobody will finish (the redelivered task message finds
its attempt taken and stops, rightly: it cannot know whether the page went out); a task
message lost with Redis leaves a row nobody claims. ``sweep.sweep_deliveries`` (on the beat) hands
each such row the next attempt, at most once per lease (a compare-and-swap on the lease).

Delivery is therefore at least once. A send that reached the provider before its worker died
is sent again by the sweeper; the page goes out once only where the provider honours the
``Idempotency-Key`` header (the same key on every attempt of a delivery). A live worker is
never raced: its lease is far longer than the HTTP timeout of one send.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from core.text import fit
from core.transitions import compare_and_swap, compare_and_swap_all
from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    DELIVERY_TRANSITIONS,
    ROUND_TRANSITIONS,
    Alert,
    AlertStatus,
    Delivery,
    DeliveryStatus,
    NotificationRound,
    RoundStatus,
    TimelineKind,
)
from incidents.notifications import senders as channels
from incidents.notifications.messages import NO_BRAKE_ACTIONS
from incidents.notifications.outgoing import outgoing_of
from incidents.notifications.queue import SEND_DELIVERY, task
from incidents.notifications.recipients import policy_for
from incidents.notifications.routing import (
    backoff_seconds,
)

log = logging.getLogger(__name__)


# An alert that braked its job (or reached L3+) and resolved before its first page went out
# still pages, saying it has since resolved: a stalled loop that answers its brake at once
# sends a heartbeat that resolves the watchdog's alert within a second, and the job would
# otherwise sit paused with nobody told. Only round 0: nothing escalates a resolved alert, and
# one a person acknowledged (then resolved) was seen already.
PAGES_WHEN_RESOLVED_SEVERITIES = ("L3", "L4")


def pages_when_resolved(severity: str, action: str) -> bool:
    return severity in PAGES_WHEN_RESOLVED_SEVERITIES or action not in NO_BRAKE_ACTIONS


# The same, as a filter on deliveries (the claim is one UPDATE).
DELIVERY_STILL_PAGES = Q(alert__status=AlertStatus.FIRING) | (
    Q(round__number=0, alert__status=AlertStatus.RESOLVED, alert__acknowledged_at__isnull=True)
    & (
        Q(alert__severity__in=PAGES_WHEN_RESOLVED_SEVERITIES)
        | ~Q(alert__action__in=NO_BRAKE_ACTIONS)
    )
)


def lease(now: datetime, extra_seconds: float = 0.0) -> datetime:
    """When a delivery handed out (or claimed) now must be finished by."""
    return now + timedelta(seconds=float(settings.NOTIFY_DELIVERY_LEASE_SECONDS) + extra_seconds)


def fan_out(delivery_ids: list[int]) -> None:
    for delivery_id in delivery_ids:
        task(SEND_DELIVERY).delay(delivery_id)


def claim(delivery: Delivery) -> bool:
    """Take the next attempt (attempts is the compare-and-swap counter), and only while the
    alert still fires: the acknowledgement check and the claim are one UPDATE. The claim
    renews the lease: the sweeper leaves this attempt alone until it runs out."""
    rows = Delivery.objects.filter(
        pk=delivery.pk, status=DeliveryStatus.QUEUED, attempts=delivery.attempts
    )
    if delivery.alert_id is not None:
        rows = rows.filter(DELIVERY_STILL_PAGES)
    return rows.update(attempts=F("attempts") + 1, lease_until=lease(timezone.now())) == 1


def attempt_delivery(
    delivery_id: int, *, now: datetime | None = None, expected_attempts: int | None = None
) -> float | None:
    """Send the delivery once; seconds to wait before a retry, or None when it is finished.

    With ``expected_attempts`` (the tasks always pass it) only that attempt is sent: while one
    worker is mid-send, the row still reads "queued", and without it a second worker would
    claim the next attempt and page the person twice."""
    delivery = Delivery.objects.select_related("recipient").get(pk=delivery_id)
    if delivery.status != DeliveryStatus.QUEUED:
        return None
    if expected_attempts is not None and delivery.attempts != expected_attempts:
        return None
    if not claim(delivery):
        alert = Alert.objects.filter(pk=delivery.alert_id).first() if delivery.alert_id else None
        if alert is not None and alert.status != AlertStatus.FIRING:
            stop_notifications(alert.pk)  # acknowledged or resolved: nothing more goes out
        return None
    delivery.attempts += 1
    outgoing = outgoing_of(delivery, policy_for(delivery.team_id).chat_format)
    result = channels.send(outgoing)
    max_attempts = int(settings.NOTIFY_MAX_ATTEMPTS)
    if result.outcome == "failed" and result.transient and delivery.attempts < max_attempts:
        base = float(settings.NOTIFY_RETRY_BASE_SECONDS)
        retry_in = backoff_seconds(delivery.attempts, base=base)
        # The lease covers the wait: the retry's ETA message (lost only with Redis) claims it.
        Delivery.objects.filter(pk=delivery.pk).update(
            provider_response=result.provider_response,
            latency_ms=result.latency_ms,
            lease_until=lease(timezone.now(), retry_in),
        )
        return retry_in
    with transaction.atomic():
        finish_attempt(
            delivery, result.outcome, result.provider_response, result, now or timezone.now()
        )
    return None


def finish_attempt(
    delivery: Delivery,
    outcome: str,
    response: str,
    result: channels.DeliveryResult | None,
    now: datetime,
) -> None:
    """queued → sent / delivered / failed, with its timeline row (call inside a transaction)."""
    stamp = {"sent": "sent_at", "delivered": "delivered_at", "failed": "failed_at"}[outcome]
    extra: dict[str, Any] = {stamp: now, "provider_response": response[:4000]}
    if outcome == "delivered":
        extra["sent_at"] = now
    if result is not None:
        extra.update(latency_ms=result.latency_ms, provider_id=fit(result.provider_id or "", 200))
    won = compare_and_swap(
        Delivery,
        delivery.pk,
        table=DELIVERY_TRANSITIONS,
        expected=[DeliveryStatus.QUEUED],
        new=outcome,
        **extra,
    )
    if won and delivery.incident_id is not None:
        outcome_timeline(delivery, outcome, extra.get("latency_ms"), now)


def outcome_timeline(
    delivery: Delivery, outcome: str, latency: float | None, now: datetime
) -> None:
    if delivery.incident_id is None:
        return  # a delivery of no incident (a test message) has no timeline
    who = delivery.recipient.get_username() if delivery.recipient else "the team"
    kind = (
        TimelineKind.NOTIFICATION_DELIVERED
        if outcome == "delivered"
        else TimelineKind.NOTIFICATION_SENT
    )
    tries = delivery.attempts
    after = (
        "before any attempt" if not tries else f"after {tries} attempt{'s' if tries != 1 else ''}"
    )
    append_timeline(
        delivery.incident_id,
        kind,
        f"{delivery.channel} to {who} {outcome} {after}: {delivery.first_line}",
        at=now,
        alert_id=delivery.alert_id,
        data={
            "delivery_id": delivery.pk,
            "channel": delivery.channel,
            "status": outcome,
            "attempts": delivery.attempts,
            "latency_ms": latency,
            "purpose": delivery.purpose,
        },
    )


def cancel_round(round_id: int) -> None:
    compare_and_swap(
        NotificationRound,
        round_id,
        table=ROUND_TRANSITIONS,
        expected=[RoundStatus.SCHEDULED],
        new=RoundStatus.CANCELLED,
    )


def stop_notifications(alert_id: int) -> int:
    """Cancel the alert's scheduled rounds and queued deliveries; how many rows stopped."""
    stopped = 0
    with transaction.atomic():
        for round_id in NotificationRound.objects.filter(
            alert_id=alert_id, status=RoundStatus.SCHEDULED
        ).values_list("pk", flat=True):
            cancel_round(round_id)
            stopped += 1
        stopped += compare_and_swap_all(
            Delivery.objects.filter(alert_id=alert_id),
            table=DELIVERY_TRANSITIONS,
            expected=[DeliveryStatus.QUEUED],
            new=DeliveryStatus.CANCELLED,
        )
    return stopped
