"""The channels behind one interface: ``send(Outgoing) -> DeliveryResult``, one module per
channel (chat, email, sms, phone; SMS and phone share the provider module)."""

from __future__ import annotations

import time
from collections.abc import Callable

from django.conf import settings

from incidents.notifications.senders.base import DeliveryResult, Outgoing
from incidents.notifications.senders.chat import chat_payload, send_chat
from incidents.notifications.senders.email import send_email
from incidents.notifications.senders.phone import call_script, send_phone, spoken
from incidents.notifications.senders.provider import provider_signature, receipt_url
from incidents.notifications.senders.sms import send_sms, sms_text

__all__ = [
    "ADAPTERS",
    "DeliveryResult",
    "Outgoing",
    "call_script",
    "chat_payload",
    "provider_signature",
    "receipt_url",
    "send",
    "sms_text",
    "spoken",
]

ADAPTERS: dict[str, Callable[[Outgoing], DeliveryResult]] = {
    "chat": send_chat,
    "email": send_email,
    "sms": send_sms,
    "phone": send_phone,
}


OUTBOX_RESPONSE = "kept in the console's Outbox, not sent (BRAKELINE_NOTIFY_OUTBOX)"


def send(outgoing: Outgoing) -> DeliveryResult:
    """Send on ``outgoing.channel``; connection errors come back as transient failures. With
    the outbox on (the demo), nothing leaves: the message is delivered to the console's Outbox
    page, which shows what would have gone out and answers as the person's phone would."""
    if settings.NOTIFY_OUTBOX:
        return DeliveryResult("delivered", OUTBOX_RESPONSE, 0.0)
    started = time.monotonic()
    try:
        return ADAPTERS[outgoing.channel](outgoing)
    except (TimeoutError, OSError) as error:  # refused, reset, timed out, SMTP disconnect
        latency = (time.monotonic() - started) * 1000
        return DeliveryResult("failed", f"{type(error).__name__}: {error}", latency, transient=True)
