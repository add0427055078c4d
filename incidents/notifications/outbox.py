"""The console's Outbox: with ``NOTIFY_OUTBOX`` on (``make demo``), pages are delivered here
instead of to a provider (``senders.send``). The page shows each message as its channel would
have carried it, and lets the person it was sent to answer it as their phone or chat would —
through the same services the provider's callbacks call (``replies``), signature aside: the
console is its own provider here, and only the page's recipient, logged in, may answer."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings

from core.errors import Forbidden, InvalidInput, NotFound
from incidents.models import Alert, AlertStatus, Delivery
from incidents.notifications import senders as channels
from incidents.notifications.outgoing import outgoing_of
from incidents.notifications.recipients import policy_for
from incidents.notifications.replies import (
    acknowledge_by_keypress,
    acknowledge_by_link,
    acknowledge_by_sms,
)
from incidents.notifications.reply_codes import ack_link_token, digest
from incidents.teams.audit import AuditContext
from incidents.teams.users import User

OUTBOX_SIZE = 50
ANSWER = {"sms": "Reply 1", "phone": "Press 1", "chat": "Acknowledge"}


def outbox_enabled() -> bool:
    return bool(settings.NOTIFY_OUTBOX)


def what_went_out(delivery: Delivery, chat_format: str) -> str:
    """The message as its channel carries it: the SMS text, the words spoken, the chat post."""
    outgoing = outgoing_of(delivery, chat_format)
    if delivery.channel == "sms":
        return channels.sms_text(outgoing)
    if delivery.channel == "phone":
        return channels.spoken(outgoing)
    if delivery.channel == "chat":
        button = f"\n[Acknowledge] → {outgoing.ack_link}" if outgoing.ack_link else ""
        return f"{delivery.first_line}\n{delivery.body}{button}"
    return f"Subject: {delivery.first_line}\n\n{delivery.body}"


def outbox(user: User, team_ids: list[int]) -> list[dict[str, Any]]:
    """The latest messages kept in the Outbox for the user's teams, newest first."""
    rows = (
        Delivery.objects.filter(team_id__in=team_ids, provider_response=channels.OUTBOX_RESPONSE)
        .select_related("recipient", "alert")
        .order_by("-id")[:OUTBOX_SIZE]
    )
    formats: dict[int, str] = {}
    entries = []
    for delivery in rows:
        if delivery.team_id not in formats:
            formats[delivery.team_id] = policy_for(delivery.team_id).chat_format
        alert: Alert | None = delivery.alert
        answerable = (
            delivery.recipient_id == user.pk
            and delivery.channel in ANSWER
            and bool(delivery.reply_code)
            and alert is not None
            and alert.status == AlertStatus.FIRING
        )
        entries.append(
            {
                "delivery": delivery,
                "text": what_went_out(delivery, formats[delivery.team_id]),
                "answer": ANSWER.get(delivery.channel, "") if answerable else "",
            }
        )
    return entries


def answer_from_outbox(user: User, delivery_id: int, context: AuditContext) -> Alert:
    """The recipient answering a page in the Outbox, as their phone or chat would."""
    if not outbox_enabled():
        raise Forbidden("The Outbox is off: pages go to the real provider.")
    delivery = Delivery.objects.filter(pk=delivery_id, recipient_id=user.pk).first()
    if delivery is None:
        raise NotFound(f"You were sent no page {delivery_id}.", fields={"delivery_id": "unknown"})
    proof = digest(f"outbox-{secrets.token_hex(16)}")
    if delivery.channel == "sms":
        return acknowledge_by_sms(delivery.address, f"1 {delivery.reply_code}", proof, context)
    if delivery.channel == "phone":
        return acknowledge_by_keypress(delivery.address, delivery.reply_code, "1", proof, context)
    if delivery.channel == "chat":
        return acknowledge_by_link(ack_link_token(delivery.pk), context)
    raise InvalidInput(
        "An e-mail is not answered here.", fields={"delivery_id": "sms, phone, chat"}
    )
