"""Notifications: who is paged, on which channels, what they read, and every delivery recorded.

An alert raised (or escalated) calls ``notify_alert`` inside its transaction; after commit a
task runs ``dispatch_alert``: round 0 pages the person on call on the channels the team's
policy routes the alert's layer and level to, one delivery (one task) per channel and person,
so a failing channel never delays the others. Unacknowledged after the policy's time, round 1
pages the managers, and so on until someone acknowledges. Acknowledging stops everything: each
delivery and each round re-checks, in the same UPDATE that claims it, that the alert is still
firing, and cancels itself (and the alert's other pending rows) when it is not. A fire drill's
alert pages the team's drill receivers instead when its policy says so (``people_to_page``).

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
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from core.text import fit
from core.transitions import compare_and_swap, compare_and_swap_all
from incidents import silences
from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    DELIVERY_TRANSITIONS,
    ROUND_TRANSITIONS,
    SYSTEM_COMMAND_REFUSED,
    Alert,
    AlertStatus,
    Contact,
    Delivery,
    DeliveryStatus,
    DrillDelivery,
    Membership,
    NotificationPolicy,
    NotificationRound,
    Role,
    RoundStatus,
    TimelineEntry,
    TimelineKind,
)
from incidents.notifications import grouping
from incidents.notifications import senders as channels
from incidents.notifications.outgoing import outgoing_of
from incidents.notifications.queue import DISPATCH_ALERT, FIRE_ROUND, SEND_DELIVERY, task
from incidents.notifications.reply_codes import REPLY_CHANNELS, new_reply_code
from incidents.notifications.routing import (
    DIGEST,
    FIRST_LINE_LENGTH,
    AlertFacts,
    Message,
    backoff_seconds,
    channels_for,
    render,
)
from incidents.teams.oncall import who_is_on_call

log = logging.getLogger(__name__)


def policy_for(team_id: int) -> NotificationPolicy:
    """The team's policy; the default policy (unsaved) when it has none (docs/design.md
    "Notifications and paging")."""
    policy = NotificationPolicy.objects.filter(team_id=team_id).first()
    return policy if policy is not None else NotificationPolicy(team_id=team_id)


def notifications_configured(team_id: int) -> bool:
    return NotificationPolicy.objects.filter(team_id=team_id).exists()


def notify_alert(alert_id: int) -> None:
    """Call inside the transaction that raised or escalated the alert: notifies after commit."""
    transaction.on_commit(lambda: task(DISPATCH_ALERT).delay(alert_id))


# --- Content ---------------------------------------------------------------------------------


def console_link(path: str) -> str:
    """A console page's address as a message carries it (BRAKELINE_PUBLIC_URL + path)."""
    return str(settings.BRAKELINE_PUBLIC_URL).rstrip("/") + path


def job_link(job_id: int) -> str:
    return console_link(f"/jobs/{job_id}/")


DRILL_PREFIX = "DRILL — "


def _refused_brake(alert: Alert) -> str:
    """The timeline's "No automatic pause: …" of this alert, if the system's brake was refused
    (breakers.control.braking writes it in the transaction that raised the alert)."""
    note = (
        TimelineEntry.objects.filter(
            alert_id=alert.pk, kind=TimelineKind.NOTE, data__event=SYSTEM_COMMAND_REFUSED
        )
        .order_by("-pk")
        .values_list("message", flat=True)
        .first()
    )
    return note or ""


def alert_message(alert: Alert) -> Message:
    job = alert.job
    message = render(
        AlertFacts(
            level=alert.severity,
            team=job.team.name,
            job_id=job.pk,
            job_name=job.name,
            metric=alert.metric,
            value=alert.value,
            threshold=alert.threshold,
            step=alert.step,
            duration_seconds=alert.duration_seconds,
            duration_steps=alert.duration_steps,
            node=alert.node,
            action=alert.action,
            runbook_suggestion=alert.runbook_suggestion,
            link=job_link(job.pk),
            refused=_refused_brake(alert),
        )
    )
    if job.drill_sandbox:  # nobody may take a fire drill's page for the real thing
        body = f"This is a fire drill on a sandbox job: no action needed.\n{message.body}"
        return Message(fit(DRILL_PREFIX + message.first_line, FIRST_LINE_LENGTH), body)
    return message


# --- Rounds ----------------------------------------------------------------------------------

# An alert that braked its job (or reached L3+) and resolved before its first page went out
# still pages, saying it has since resolved: a stalled loop that answers its brake at once
# sends a heartbeat that resolves the watchdog's alert within a second, and the job would
# otherwise sit paused with nobody told. Only round 0: nothing escalates a resolved alert, and
# one a person acknowledged (then resolved) was seen already.
PAGES_WHEN_RESOLVED_SEVERITIES = ("L3", "L4")
NO_BRAKE_ACTIONS = ("", "none", "record")


def pages_when_resolved(severity: str, action: str) -> bool:
    return severity in PAGES_WHEN_RESOLVED_SEVERITIES or action not in NO_BRAKE_ACTIONS


def _still_pages(alert: Alert, round_number: int = 0) -> bool:
    """Whether a page of this round of the alert may (still) go out."""
    if alert.status == AlertStatus.FIRING:
        return True
    return (
        round_number == 0
        and alert.status == AlertStatus.RESOLVED
        and alert.acknowledged_at is None
        and pages_when_resolved(alert.severity, alert.action)
    )


# The same, as a filter on deliveries (the claim is one UPDATE).
_DELIVERY_STILL_PAGES = Q(alert__status=AlertStatus.FIRING) | (
    Q(round__number=0, alert__status=AlertStatus.RESOLVED, alert__acknowledged_at__isnull=True)
    & (
        Q(alert__severity__in=PAGES_WHEN_RESOLVED_SEVERITIES)
        | ~Q(alert__action__in=NO_BRAKE_ACTIONS)
    )
)


def dispatch_alert(alert_id: int, *, now: datetime | None = None) -> list[int]:
    """Round 0 of the alert at its current level (once: a second call finds the round)."""
    now = now or timezone.now()
    alert = Alert.objects.select_related("job__team").get(pk=alert_id)
    if not _still_pages(alert) or alert.layer == "performance":
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
        # The alert's row lock orders this round against an acknowledgement (its UPDATE
        # waits) and against a second copy of this task (which then finds the round fired).
        # Only the alert's row (of=self): a plain FOR UPDATE over the join also locks the job
        # and team rows, which ingest and acknowledgements lock job first, then alert — a
        # deadlock the fire drills hit with nine sandboxes braking at once.
        alert = (
            Alert.objects.select_for_update(of=("self",))
            .select_related("job__team")
            .get(pk=alert_id)
        )
        round_ = NotificationRound.objects.get(pk=round_id)
        if round_.status != RoundStatus.SCHEDULED:
            return []
        if round_.due_at > now:
            return None
        if not _still_pages(alert, round_.number) or alert.severity != round_.severity:
            _cancel_round(round_.pk)
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
        ids = _plan_deliveries(alert, round_, policy, people, now)
        if alert.status == AlertStatus.FIRING:  # a resolved alert pages once, never escalates
            _schedule_next_round(alert, round_, policy, now)
        transaction.on_commit(lambda: fan_out(ids))
    return ids


def people_to_page(
    team_id: int,
    number: int,
    now: datetime,
    *,
    drill: bool,
    policy: NotificationPolicy | None = None,
) -> list[Any]:
    """Whom round ``number`` of an alert of the team pages: the one rule, asked by the round
    and by the drill runner (which checks that the page reached them).

    A fire drill's alert (``drill``: its job is a drill sandbox) of a team whose policy sends
    drills to its drill receivers pages those receivers in every round, in id order, so a
    drill never wakes the on-call; receivers who have since left the team are skipped, and
    when none is left the drill pages as any alert does (a drill must reach somebody)."""
    policy = policy if policy is not None else policy_for(team_id)
    if drill and policy.pk is not None and policy.drill_delivery == DrillDelivery.RECEIVERS:
        receivers = policy.drill_receivers.filter(memberships__team_id=team_id).distinct()
        people = list(receivers.order_by("id"))
        if people:
            return people
    return _people_for_round(team_id, number, now)


def _people_for_round(team_id: int, number: int, now: datetime) -> list[Any]:
    """Round 0: the person on call (the managers when nobody is); later rounds: the managers."""
    on_call = who_is_on_call(team_id, now)[:1]
    if number == 0 and on_call:
        return on_call
    return managers_of(team_id)


def managers_of(team_id: int) -> list[Any]:
    """The team's managers; its admins when it has none (someone must be reachable)."""
    for role in (Role.MANAGER, Role.ADMIN):
        members = Membership.objects.filter(team_id=team_id, role=role).select_related("user")
        people = [m.user for m in members.order_by("id")]
        if people:
            return people
    return []


def _schedule_next_round(
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


def _cancel_round(round_id: int) -> None:
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
            _cancel_round(round_id)
            stopped += 1
        stopped += compare_and_swap_all(
            Delivery.objects.filter(alert_id=alert_id),
            table=DELIVERY_TRANSITIONS,
            expected=[DeliveryStatus.QUEUED],
            new=DeliveryStatus.CANCELLED,
        )
    return stopped


# --- Deliveries ------------------------------------------------------------------------------


def _address(channel: str, person: Any, policy: NotificationPolicy) -> str:
    if channel == "chat":
        return policy.chat_webhook_url
    if channel == "email":
        return person.email or ""
    contact = Contact.objects.filter(user=person).first()
    return contact.phone if contact is not None else ""


def _purpose(alert: Alert, round_: NotificationRound) -> str:
    if alert.job.drill_sandbox:
        return "drill"
    return "alert" if round_.number == 0 else "escalation"


RESOLVED_MARK = " (resolved since)"


def _since_resolved(alert: Alert, message: Message) -> Message:
    """A page of an alert that resolved before it went out says so (see _still_pages)."""
    if alert.status != AlertStatus.RESOLVED:
        return message
    when = alert.resolved_at.strftime("%H:%M:%S UTC") if alert.resolved_at else "since"
    first = fit(message.first_line, FIRST_LINE_LENGTH - len(RESOLVED_MARK)) + RESOLVED_MARK
    why = (
        f"it braked the job ({alert.action})"
        if alert.action not in NO_BRAKE_ACTIONS
        else (f"it reached {alert.severity}")
    )
    body = f"Resolved at {when}, before this page went out; paged because {why}.\n"
    return Message(first, body + message.body)


def _plan_deliveries(
    alert: Alert,
    round_: NotificationRound,
    policy: NotificationPolicy,
    people: list[Any],
    now: datetime,
) -> list[int]:
    """One queued delivery per channel and person (one chat message per round names them all);
    a missing address is a failed delivery at once, so the gap shows on the timeline."""
    message = _since_resolved(alert, alert_message(alert))
    names = ", ".join(p.get_username() for p in people) or "nobody (no on-call, no managers)"
    body = f"{message.body}\nPaging: {names} (round {round_.number})"
    ids = []
    for channel in channels_for(policy.rules, alert.layer, alert.severity):
        if channel == DIGEST:
            continue
        targets = people[:1] if channel == "chat" else people
        for person in targets or [None]:
            address = _address(channel, person, policy) if person or channel == "chat" else ""
            delivery = Delivery.objects.create(
                team_id=alert.job.team_id,
                alert=alert,
                round=round_,
                incident_id=alert.incident_id,
                recipient=person,
                channel=channel,
                address=address,
                purpose=_purpose(alert, round_),
                first_line=fit(message.first_line, FIRST_LINE_LENGTH),
                body=body,
                lease_until=lease(now),
                reply_code=new_reply_code() if channel in REPLY_CHANNELS else "",
            )
            if not address:
                _finish(delivery, "failed", f"no {channel} address for {person}", None, now)
            else:
                ids.append(delivery.pk)
    if not ids:  # the console's banner says so too (incidents.notifications.reach)
        log.warning(
            "team %r (id %s): %s alert %s round %s pages nobody (no address on any channel)",
            alert.job.team.name,
            alert.job.team_id,
            alert.severity,
            alert.pk,
            round_.number,
        )
    return ids


def queue_message(
    team_id: int, person: Any, channel: str, message: Message, *, purpose: str, incident_id=None
) -> Delivery:
    """A delivery that is no alert's (a test, an escalation request), queued after commit."""
    policy = policy_for(team_id)
    address = _address(channel, person, policy)
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
            _finish(delivery, "failed", f"no {channel} address for {person}", None, timezone.now())
        else:
            transaction.on_commit(lambda: fan_out([delivery.pk]))
    return delivery


def lease(now: datetime, extra_seconds: float = 0.0) -> datetime:
    """When a delivery handed out (or claimed) now must be finished by."""
    return now + timedelta(seconds=float(settings.NOTIFY_DELIVERY_LEASE_SECONDS) + extra_seconds)


def fan_out(delivery_ids: list[int]) -> None:
    for delivery_id in delivery_ids:
        task(SEND_DELIVERY).delay(delivery_id)


def _claim(delivery: Delivery) -> bool:
    """Take the next attempt (attempts is the compare-and-swap counter), and only while the
    alert still fires: the acknowledgement check and the claim are one UPDATE. The claim
    renews the lease: the sweeper leaves this attempt alone until it runs out."""
    rows = Delivery.objects.filter(
        pk=delivery.pk, status=DeliveryStatus.QUEUED, attempts=delivery.attempts
    )
    if delivery.alert_id is not None:
        rows = rows.filter(_DELIVERY_STILL_PAGES)
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
    if not _claim(delivery):
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
        _finish(delivery, result.outcome, result.provider_response, result, now or timezone.now())
    return None


def _finish(
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
