"""An alert's rounds of pages.

An alert raised (or escalated) calls ``notify_alert`` inside its transaction; after commit a
task runs ``dispatch_alert``: round 0 pages the person on call on the channels the team's
policy routes the alert's layer and level to, one delivery (one task) per channel and person,
so a failing channel never delays the others. Unacknowledged after the policy's time, round 1
pages the managers, and so on until someone acknowledges. Acknowledging stops everything: each
delivery and each round re-checks, in the same UPDATE that claims it, that the alert is still
firing, and cancels itself (and the alert's other pending rows) when it is not. A fire drill's
alert pages the team's drill receivers instead when its policy says so
(``recipients.people_to_page``). Whom and where: ``recipients``; what a page says:
``messages``; sending one delivery: ``delivery``.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from core.text import fit
from core.transitions import compare_and_swap
from incidents import silences
from incidents.models import (
    ROUND_TRANSITIONS,
    Alert,
    AlertStatus,
    Delivery,
    NotificationPolicy,
    NotificationRound,
    RoundStatus,
)
from incidents.notifications import grouping
from incidents.notifications.delivery import (
    cancel_round,
    fan_out,
    finish_attempt,
    lease,
    pages_when_resolved,
)
from incidents.notifications.messages import alert_message, since_resolved
from incidents.notifications.queue import DISPATCH_ALERT, FIRE_ROUND, task
from incidents.notifications.recipients import (
    address_for,
    notifications_configured,
    people_to_page,
    policy_for,
)
from incidents.notifications.reply_codes import REPLY_CHANNELS, new_reply_code
from incidents.notifications.routing import (
    DIGEST,
    FIRST_LINE_LENGTH,
    Message,
    channels_for,
)

log = logging.getLogger(__name__)


def notify_alert(alert_id: int) -> None:
    """Call inside the transaction that raised or escalated the alert: notifies after commit."""
    transaction.on_commit(lambda: task(DISPATCH_ALERT).delay(alert_id))


def still_pages(alert: Alert, round_number: int = 0) -> bool:
    """Whether a page of this round of the alert may (still) go out."""
    if alert.status == AlertStatus.FIRING:
        return True
    return (
        round_number == 0
        and alert.status == AlertStatus.RESOLVED
        and alert.acknowledged_at is None
        and pages_when_resolved(alert.severity, alert.action)
    )


def dispatch_alert(alert_id: int, *, now: datetime | None = None) -> list[int]:
    """Round 0 of the alert at its current level (once: a second call finds the round)."""
    now = now or timezone.now()
    alert = Alert.objects.select_related("job__team").get(pk=alert_id)
    if not still_pages(alert) or alert.layer == "performance":
        return []  # acknowledged already, resolved without braking, or a digest finding
    if not notifications_configured(alert.job.team_id):
        # A team that never set up notifications has no addresses to page: say so in the log
        # rather than fill its timeline with failed deliveries.
        log.warning(
            "team %r (id %s) has no notification policy: %s alert %s pages nobody",
            alert.job.team.name,
            alert.job.team_id,
            alert.severity,
            alert_id,
        )
        return []
    try:
        with transaction.atomic():
            leader = grouping.page_leader(alert)  # an alert storm pages once per level
            if leader is not None:
                grouping.record_grouped(alert, leader, now)
                return []
            round_ = NotificationRound.objects.create(
                alert=alert, severity=alert.severity, number=0, due_at=now
            )
    except IntegrityError:
        return []
    return fire_round(round_.pk, now=now) or []


def fire_round(round_id: int, *, now: datetime | None = None) -> list[int] | None:
    """Page the round's people; None when it is not due yet (the task comes back later)."""
    now = now or timezone.now()
    alert_id = (
        NotificationRound.objects.filter(pk=round_id).values_list("alert_id", flat=True).first()
    )
    if alert_id is None:
        return []  # the alert (and its rounds) is gone; an ETA task outlived it
    with transaction.atomic():
        alert = _lock_alert(alert_id)
        round_ = NotificationRound.objects.get(pk=round_id)
        if round_.status != RoundStatus.SCHEDULED:
            return []
        if round_.due_at > now:
            return None
        if not still_pages(alert, round_.number) or alert.severity != round_.severity:
            cancel_round(round_.pk)
            return []
        if silences.hold_back(alert, round_, now):
            return []  # a silence holds the page (never the brake) until it ends
        if not compare_and_swap(
            NotificationRound,
            round_.pk,
            table=ROUND_TRANSITIONS,
            expected=[RoundStatus.SCHEDULED],
            new=RoundStatus.FIRED,
            fired_at=now,
        ):
            return []
        policy = policy_for(alert.job.team_id)
        people = people_to_page(
            alert.job.team_id, round_.number, now, drill=alert.job.drill_sandbox, policy=policy
        )
        ids = plan_deliveries(alert, round_, policy, people, now)
        if alert.status == AlertStatus.FIRING:  # a resolved alert pages once, never escalates
            schedule_next_round(alert, round_, policy, now)
        transaction.on_commit(lambda: fan_out(ids))
    return ids


def _lock_alert(alert_id: int) -> Alert:
    """The round's alert, row-locked (with its job and team read along)."""
    # The alert's row lock orders this round against an acknowledgement (its UPDATE
    # waits) and against a second copy of this task (which then finds the round fired).
    # Only the alert's row (of=self): a plain FOR UPDATE over the join also locks the job
    # and team rows, which ingest and acknowledgements lock job first, then alert — a
    # deadlock the fire drills hit with nine sandboxes braking at once.
    return (
        Alert.objects.select_for_update(of=("self",)).select_related("job__team").get(pk=alert_id)
    )


def schedule_next_round(
    alert: Alert, round_: NotificationRound, policy: NotificationPolicy, now: datetime
) -> None:
    if alert.severity < policy.escalate_min_level or round_.number >= policy.max_rounds:
        return
    due = now + timedelta(seconds=policy.ack_timeout_seconds)
    following, created = NotificationRound.objects.get_or_create(
        alert=alert, severity=round_.severity, number=round_.number + 1, defaults={"due_at": due}
    )
    if created:
        transaction.on_commit(lambda: task(FIRE_ROUND).apply_async((following.pk,), eta=due))


def fire_due_rounds(*, now: datetime | None = None) -> list[int]:
    """Fire every scheduled round that is due (beat's safety net for lost ETA tasks)."""
    now = now or timezone.now()
    due = NotificationRound.objects.filter(status=RoundStatus.SCHEDULED, due_at__lte=now)
    fired: list[int] = []
    for round_id in due.values_list("pk", flat=True):
        fired.extend(fire_round(round_id, now=now) or [])
    return fired


def purpose_of(alert: Alert, round_: NotificationRound) -> str:
    if alert.job.drill_sandbox:
        return "drill"
    return "alert" if round_.number == 0 else "escalation"


def plan_deliveries(
    alert: Alert,
    round_: NotificationRound,
    policy: NotificationPolicy,
    people: list[Any],
    now: datetime,
) -> list[int]:
    """One queued delivery per channel and person (one chat message per round names them all);
    a missing address is a failed delivery at once, so the gap shows on the timeline."""
    message = since_resolved(alert, alert_message(alert))
    names = ", ".join(p.get_username() for p in people) or "nobody (no on-call, no managers)"
    body = f"{message.body}\nPaging: {names} (round {round_.number})"
    ids = []
    for channel in channels_for(policy.rules, alert.layer, alert.severity):
        if channel == DIGEST:
            continue
        targets = people[:1] if channel == "chat" else people
        for person in targets or [None]:
            address = address_for(channel, person, policy) if person or channel == "chat" else ""
            delivery = _queue_page(alert, round_, person, channel, address, message, body, now)
            if not address:
                finish_attempt(delivery, "failed", f"no {channel} address for {person}", None, now)
            else:
                ids.append(delivery.pk)
    if not ids:  # the console's banner says so too (incidents.notifications.reach)
        _warn_pages_nobody(alert, round_)
    return ids


def _queue_page(
    alert: Alert,
    round_: NotificationRound,
    person: Any,
    channel: str,
    address: str,
    message: Message,
    body: str,
    now: datetime,
) -> Delivery:
    """One queued page of the round to one person on one channel (leased to the sender)."""
    return Delivery.objects.create(
        team_id=alert.job.team_id,
        alert=alert,
        round=round_,
        incident_id=alert.incident_id,
        recipient=person,
        channel=channel,
        address=address,
        purpose=purpose_of(alert, round_),
        first_line=fit(message.first_line, FIRST_LINE_LENGTH),
        body=body,
        lease_until=lease(now),
        reply_code=new_reply_code() if channel in REPLY_CHANNELS else "",
    )


def _warn_pages_nobody(alert: Alert, round_: NotificationRound) -> None:
    log.warning(
        "team %r (id %s): %s alert %s round %s pages nobody (no address on any channel)",
        alert.job.team.name,
        alert.job.team_id,
        alert.severity,
        alert.pk,
        round_.number,
    )


def queue_message(
    team_id: int, person: Any, channel: str, message: Message, *, purpose: str, incident_id=None
) -> Delivery:
    """A delivery that is no alert's (a test, an escalation request), queued after commit."""
    policy = policy_for(team_id)
    address = address_for(channel, person, policy)
    with transaction.atomic():
        delivery = Delivery.objects.create(
            team_id=team_id,
            incident_id=incident_id,
            recipient=person,
            channel=channel,
            address=address,
            purpose=purpose,
            first_line=fit(message.first_line, FIRST_LINE_LENGTH),
            body=message.body,
            lease_until=lease(timezone.now()),
        )
        if not address:
            finish_attempt(
                delivery, "failed", f"no {channel} address for {person}", None, timezone.now()
            )
        else:
            transaction.on_commit(lambda: fan_out([delivery.pk]))
    return delivery
