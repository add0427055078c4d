"""SMS through the provider: the message's short form."""

from __future__ import annotations

from django.conf import settings

from incidents.notifications.senders.base import DeliveryResult, Outgoing
from incidents.notifications.senders.provider import post_to_provider, with_callback


def send_sms(outgoing: Outgoing) -> DeliveryResult:
    sender = str(settings.NOTIFY_PROVIDER_FROM_NUMBER)
    form = {"To": outgoing.address, "From": sender, "Body": outgoing.message.sms()}
    return post_to_provider("Messages.json", with_callback(form), outgoing.key_header())
