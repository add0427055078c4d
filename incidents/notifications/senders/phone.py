"""A phone call through the provider: the first line, spoken."""

from __future__ import annotations

from html import escape

from django.conf import settings

from incidents.notifications.senders.base import DeliveryResult, Outgoing
from incidents.notifications.senders.provider import post_to_provider, with_callback


def send_phone(outgoing: Outgoing) -> DeliveryResult:
    sender = str(settings.NOTIFY_PROVIDER_FROM_NUMBER)
    message = outgoing.message
    speech = f"Brakeline alert. {message.first_line}. Acknowledge it in the console."
    twiml = f"<Response><Say>{escape(speech)}</Say></Response>"
    form = {"To": outgoing.address, "From": sender, "Twiml": twiml}
    return post_to_provider("Calls.json", with_callback(form), outgoing.key_header())
