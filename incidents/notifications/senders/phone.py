"""A phone call through the provider: the first line, spoken; an alert's call asks for the key
1 and sends the keypress to the console (``console.api.notifications.PhoneReplyView``)."""

from __future__ import annotations

import urllib.parse
from html import escape

from django.conf import settings

from incidents.notifications.senders.base import DeliveryResult, Outgoing
from incidents.notifications.senders.provider import post_to_provider, with_callback


def keypress_url(code: str) -> str:
    base = str(settings.BRAKELINE_PUBLIC_URL).rstrip("/")
    return f"{base}/api/v1/notifications/replies/phone?" + urllib.parse.urlencode({"code": code})


def spoken(outgoing: Outgoing) -> str:
    said = f"Brakeline alert. {outgoing.message.first_line}."
    if not outgoing.reply_code:
        return f"{said} Acknowledge it in the console."
    return f"{said} Press 1 to acknowledge."


def call_script(outgoing: Outgoing) -> str:
    words = escape(spoken(outgoing))
    if not outgoing.reply_code:
        return f"<Response><Say>{words}</Say></Response>"
    action = escape(keypress_url(outgoing.reply_code))
    return (
        f'<Response><Gather numDigits="1" method="POST" action="{action}">'
        f"<Say>{words}</Say></Gather></Response>"
    )


def send_phone(outgoing: Outgoing) -> DeliveryResult:
    sender = str(settings.NOTIFY_PROVIDER_FROM_NUMBER)
    form = {"To": outgoing.address, "From": sender, "Twiml": call_script(outgoing)}
    return post_to_provider("Calls.json", with_callback(form), outgoing.key_header())
