"""E-mail: Django's SMTP backend, named explicitly (NOTIFY_EMAIL_BACKEND) so that a test
runner's locmem EMAIL_BACKEND never swallows a page."""

from __future__ import annotations

import time

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from incidents.notifications.senders.base import DeliveryResult, Outgoing, timeout


def send_email(outgoing: Outgoing) -> DeliveryResult:
    backend, sender = settings.NOTIFY_EMAIL_BACKEND, settings.NOTIFY_EMAIL_FROM
    started = time.monotonic()
    connection = get_connection(backend, fail_silently=False, timeout=timeout())
    mail = EmailMessage(
        outgoing.message.first_line,
        outgoing.message.body,
        sender,
        [outgoing.address],
        connection=connection,
    )
    mail.send()
    latency = (time.monotonic() - started) * 1000
    # The receiving SMTP server accepted it: as far as we can know, delivered.
    return DeliveryResult("delivered", "250 accepted by SMTP server", latency)
