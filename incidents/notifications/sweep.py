"""The delivery sweep (on the beat, ``notifications.sweep_deliveries``): work lost with a
worker or with Redis is handed out again.

A worker SIGKILLed mid-send leaves its delivery queued with a claimed attempt nobody will
finish; a task message lost with Redis leaves a delivery nobody claims, or an alert whose
dispatch never ran. Both are found here by their lease (``delivery.lease``) or by the missing
round, and handed out again at most once per lease (a compare-and-swap on it). Dispatching
twice never pages twice: the round's unique constraint makes ``dispatch_alert`` idempotent.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.db.models.fields.json import KT
from django.utils import timezone

from incidents.models import (
    Alert,
    AlertStatus,
    Delivery,
    DeliveryStatus,
    NotificationRound,
    TimelineEntry,
    TimelineKind,
)
from incidents.notifications.delivery import lease
from incidents.notifications.queue import DISPATCH_ALERT, SEND_DELIVERY, task

# Queued deliveries a sweep re-queues at most: the rest wait for the next sweep.
SWEEP_LIMIT = 500
# Alerts older than this are not looked at by the sweep for a lost dispatch.
SWEEP_ALERTS_WITHIN = timedelta(days=1)

log = logging.getLogger(__name__)


def undispatched_alerts(now: datetime) -> list[int]:
    """Firing alerts that should page and have no round 0 at their level: their dispatch task
    was lost (published while Redis was down, or lost with it). dispatch_alert is idempotent
    (the round's unique constraint), so sending it again never pages twice."""
    rounds = NotificationRound.objects.filter(
        alert=OuterRef("pk"), severity=OuterRef("severity"), number=0
    )
    alerts = Alert.objects.filter(
        status=AlertStatus.FIRING,
        # A lease's grace: a dispatch on its way is not raced (it would be harmless anyway).
        raised_at__lt=now - timedelta(seconds=float(settings.NOTIFY_DELIVERY_LEASE_SECONDS)),
        raised_at__gte=now - SWEEP_ALERTS_WITHIN,
        job__team__notification_policy__isnull=False,
    ).exclude(layer="performance")
    # An alert of a storm that pages through its leader has no round of its own, by design: its
    # "grouped" note says its dispatch ran (else the sweep would dispatch it every 10 s).
    grouped = TimelineEntry.objects.annotate(noted_severity=KT("data__severity")).filter(
        alert_id=OuterRef("pk"),
        kind=TimelineKind.NOTE,
        data__notification="grouped",
        noted_severity=OuterRef("severity"),
    )
    alerts = alerts.filter(~Exists(rounds), ~Exists(grouped))
    return list(alerts.values_list("pk", flat=True)[:SWEEP_LIMIT])


def sweep_deliveries(*, now: datetime | None = None) -> list[int]:
    """Re-queue every queued delivery whose lease ran out; the ids re-queued. Also dispatch
    again the alerts whose dispatch was lost (see undispatched_alerts).

    The next attempt is the row's current ``attempts``: if the dead worker's claim somehow
    finishes after all, the new task finds its attempt taken. The lease is moved forward by a
    compare-and-swap first, so two sweepers (or two beats) re-queue a row once."""
    now = now or timezone.now()
    expired = Delivery.objects.filter(status=DeliveryStatus.QUEUED, lease_until__lt=now)
    requeued: list[tuple[int, int]] = []
    for delivery_id, attempts, until in expired.values_list("pk", "attempts", "lease_until")[
        :SWEEP_LIMIT
    ]:
        won = Delivery.objects.filter(
            pk=delivery_id, status=DeliveryStatus.QUEUED, attempts=attempts, lease_until=until
        ).update(lease_until=lease(now))
        if won:
            requeued.append((delivery_id, attempts))
    lost = undispatched_alerts(now)
    if lost:
        log.warning("dispatching %d alerts whose dispatch was lost: %s", len(lost), lost)
        transaction.on_commit(lambda: [task(DISPATCH_ALERT).delay(pk) for pk in lost])
    if requeued:
        log.warning("re-queued %d deliveries whose lease ran out: %s", len(requeued), requeued)
        transaction.on_commit(
            lambda: [task(SEND_DELIVERY).delay(pk, attempt) for pk, attempt in requeued]
        )
    return [pk for pk, _ in requeued]
