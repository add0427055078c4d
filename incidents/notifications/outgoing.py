"""What a delivery sends, as its channel's sender takes it: the one rule for the senders and
the console's Outbox (which shows what would have gone out)."""

from __future__ import annotations

from incidents.models import Delivery
from incidents.notifications import senders as channels
from incidents.notifications.reply_codes import ack_link
from incidents.notifications.routing import Message


def outgoing_of(delivery: Delivery, chat_format: str) -> channels.Outgoing:
    chat_link = bool(delivery.reply_code) and delivery.channel == "chat"
    return channels.Outgoing(
        delivery.channel,
        delivery.address,
        Message(delivery.first_line, delivery.body),
        chat_format,
        idempotency_key=f"brakeline-delivery-{delivery.pk}",
        reply_code=delivery.reply_code,
        ack_link=ack_link(delivery.pk) if chat_link else "",
    )
