"""Answers to a page: an SMS reply, a call's keypress, a chat message's acknowledge link.

Each names one page (a delivery of an alert) and acknowledges its alert as the person it was
sent to, through the very service a console click calls (``acknowledge_alert``: membership,
role, the timeline row, the end of the paging), audited with the channel as ``via``. The
request's proof — the digest of its signature, or of the link's token — is kept in a
``PageReply`` row in the same transaction as the acknowledgement (or its refusal's audit row):
the same request a second time is refused as a replay, and nothing is half-written.
"""

from __future__ import annotations

import time
from dataclasses import replace

from django.db import IntegrityError, transaction
from django.utils import timezone

from core.errors import Conflict, Forbidden, InvalidInput, NotFound, ServiceError
from incidents.alerts.acknowledge import acknowledge_alert
from incidents.models import Alert, AlertStatus, Delivery, PageReply
from incidents.notifications.reply_codes import (
    BadReply,
    check_signature,
    digest,
    parse_sms_reply,
    read_ack_link_token,
)
from incidents.teams.audit import AuditContext

VIA = {"sms": "sms-reply", "phone": "phone-keypress", "chat": "chat-link"}
NOTE = {"sms": "by SMS reply", "phone": "by phone keypress", "chat": "from the chat message"}


def verify_provider_request(
    secret: str, timestamp: str, signature: str, path: str, body: bytes
) -> str:
    """The proof's digest of a provider's signed request; Forbidden naming the header if not."""
    try:
        check_signature(secret, timestamp, signature, path, body, time.time())
    except BadReply as bad:
        raise Forbidden(f"{bad.field} {bad}.", fields={bad.field: str(bad)}) from None
    return digest(signature)


def _field(value: str, name: str, limit: int = 64) -> str:
    value = value.strip()
    if not value or len(value) > limit or "\x00" in value:
        raise InvalidInput(f"{name} is missing or malformed.", fields={name: "required"})
    return value


def acknowledge_by_sms(sender: str, text: str, proof: str, context: AuditContext) -> Alert:
    """A reply to an alert's SMS: "1" acknowledges the latest firing page sent to ``sender``;
    "1 CODE" the page that carried CODE."""
    sender = _field(sender, "From")
    try:
        code = parse_sms_reply(text)
    except BadReply as bad:
        raise InvalidInput(f"{bad.field}: {bad}.", fields={bad.field: str(bad)}) from None
    pages = Delivery.objects.filter(channel="sms", address=sender, alert__isnull=False)
    pages = pages.exclude(reply_code="")
    pages = pages.filter(reply_code=code) if code else pages.filter(alert__status="firing")
    delivery = pages.select_related("recipient").order_by("-id").first()
    if delivery is None:
        what = f"with code {code}" if code else "awaiting an answer"
        raise NotFound(f"No page {what} was sent to {sender}.", fields={"From": "no such page"})
    return _answer(delivery, "sms", proof, context)


def acknowledge_by_keypress(
    callee: str, code: str, digits: str, proof: str, context: AuditContext
) -> Alert:
    """The key pressed during an alert's call (the code rides in the callback's address)."""
    callee, code = _field(callee, "To"), _field(code, "code", 16).upper()
    if digits.strip() != "1":
        raise InvalidInput("Only the key 1 acknowledges.", fields={"Digits": "press 1"})
    delivery = (
        Delivery.objects.filter(channel="phone", address=callee, reply_code=code)
        .exclude(alert__isnull=True)
        .select_related("recipient")
        .first()
    )
    if delivery is None:
        raise NotFound(f"No call with code {code} went to {callee}.", fields={"code": "unknown"})
    return _answer(delivery, "phone", proof, context)


def page_of_link(token: str) -> Delivery:
    """The chat page an acknowledge link names; InvalidInput / NotFound naming the token."""
    try:
        delivery_id = read_ack_link_token(token)
    except BadReply as bad:
        raise InvalidInput(f"{bad}.", fields={bad.field: str(bad)}) from None
    delivery = (
        Delivery.objects.filter(pk=delivery_id, channel="chat", alert__isnull=False)
        .select_related("recipient", "alert__job__team")
        .first()
    )
    if delivery is None:
        raise NotFound("This acknowledge link names no page.", fields={"token": "unknown"})
    return delivery


def acknowledge_by_link(token: str, context: AuditContext) -> Alert:
    """The chat message's button: a one-time link, signed by the console, naming the page."""
    return _answer(page_of_link(token), "chat", digest(token), context)


def link_state(delivery: Delivery) -> str:
    """What the link's page says before the button: firing, or already answered."""
    if PageReply.objects.filter(delivery=delivery).exists():
        return "used"
    alert = delivery.alert
    return alert.status if alert is not None else AlertStatus.RESOLVED


def _answer(delivery: Delivery, channel: str, proof: str, context: AuditContext) -> Alert:
    person = delivery.recipient
    if person is None or delivery.alert_id is None:
        raise Forbidden(
            "This page was sent to nobody in particular: acknowledge it in the console."
        )
    context = replace(context, via=VIA[channel])
    refused: ServiceError | None = None
    try:
        with transaction.atomic():
            PageReply.objects.create(
                channel=channel, digest=proof, delivery=delivery, received_at=timezone.now()
            )
            try:
                alert = acknowledge_alert(
                    person, delivery.alert_id, note=NOTE[channel], context=context
                )
            except ServiceError as error:
                refused = error  # its audit row commits with the reply's record
    except IntegrityError:
        raise Conflict(
            "This answer was already received (a replayed request or a used link).",
            fields={"proof": "already used"},
        ) from None
    if refused is not None:
        raise refused
    return alert
