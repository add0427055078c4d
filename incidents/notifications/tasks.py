"""Notification tasks: ids in, idempotent (every step is a compare-and-swap), acks_late.

In the embedded mode tasks are eager, where ``self.retry`` raises instead of retrying and an
ETA is ignored: transient failures are then retried at once (capped by NOTIFY_MAX_ATTEMPTS),
and rounds not yet due are left to ``fire_due_rounds`` (the periodic sweep).
"""

from __future__ import annotations

from celery import shared_task

from incidents.models import NotificationPolicy
from incidents.notifications import delivery, queue, rounds, sweep
from incidents.notifications import policy as notify_services


@shared_task(name=queue.DISPATCH_ALERT, acks_late=True, ignore_result=True)
def dispatch_alert_task(alert_id: int) -> None:
    rounds.dispatch_alert(alert_id)


@shared_task(name=queue.FIRE_ROUND, bind=True, acks_late=True, ignore_result=True, max_retries=None)
def fire_round_task(self, round_id: int) -> None:
    if rounds.fire_round(round_id) is None and not self.request.is_eager:
        # Handed out early (a broker's visibility timeout can redeliver an ETA task).
        raise self.retry(countdown=5)


@shared_task(name="notifications.fire_due_rounds", acks_late=True, ignore_result=True)
def fire_due_rounds_task() -> None:
    rounds.fire_due_rounds()


@shared_task(
    name=queue.SEND_DELIVERY,
    bind=True,
    acks_late=True,
    ignore_result=True,
    max_retries=None,
)
def send_delivery_task(self, delivery_id: int, attempt: int = 0) -> None:
    # Each task owns one attempt number: a duplicate message, or a second worker, finds the
    # attempt already taken and sends nothing. Only transient failures come back with a delay.
    retry_in = delivery.attempt_delivery(delivery_id, expected_attempts=attempt)
    while retry_in is not None and self.request.is_eager:
        attempt += 1
        retry_in = delivery.attempt_delivery(delivery_id, expected_attempts=attempt)
    if retry_in is not None:
        raise self.retry(args=(delivery_id, attempt + 1), countdown=retry_in)


@shared_task(name="notifications.sweep_deliveries", acks_late=True, ignore_result=True)
def sweep_deliveries_task() -> None:
    sweep.sweep_deliveries()


@shared_task(name="notifications.daily_digest", acks_late=True, ignore_result=True)
def daily_digest_task() -> None:
    for team_id in NotificationPolicy.objects.values_list("team_id", flat=True):
        notify_services.send_daily_digest(team_id)
