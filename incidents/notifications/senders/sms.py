"""SMS through the provider: the message's short form, and how to acknowledge by replying."""

from __future__ import annotations

from django.conf import settings

from incidents.notifications.reply_codes import sms_reply_text
from incidents.notifications.senders.base import DeliveryResult, Outgoing
from incidents.notifications.senders.provider import post_to_provider, with_callback

SMS_LIMIT = 480


def sms_text(outgoing: Outgoing) -> str:
    reply = sms_reply_text(outgoing.reply_code)
    if not reply:
        return outgoing.message.sms(SMS_LIMIT)
    return outgoing.message.sms(SMS_LIMIT - len(reply) - 1) + "\n" + reply


def send_sms(outgoing: Outgoing) -> DeliveryResult:
    sender = str(settings.NOTIFY_PROVIDER_FROM_NUMBER)
    form = {"To": outgoing.address, "From": sender, "Body": sms_text(outgoing)}
    return post_to_provider("Messages.json", with_callback(form), outgoing.key_header())
