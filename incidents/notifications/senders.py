"""Channel adapters behind one interface: ``send(Outgoing) -> DeliveryResult``.

Chat: a webhook, generic JSON or a Slack-compatible payload. E-mail: Django's SMTP backend
(named explicitly, so a test runner's locmem EMAIL_BACKEND never swallows a page). SMS and
phone: a Twilio-style provider (form POST to ``{base}/Messages.json`` and ``{base}/Calls.json``
with basic auth). Settings (config/settings.py, from the environment; see the README):

    BRAKELINE_PUBLIC_URL, NOTIFY_PROVIDER_BASE_URL, NOTIFY_PROVIDER_ACCOUNT_SID,
    NOTIFY_PROVIDER_AUTH_TOKEN, NOTIFY_PROVIDER_FROM_NUMBER, NOTIFY_EMAIL_FROM,
    NOTIFY_EMAIL_BACKEND, NOTIFY_HTTP_TIMEOUT_SECONDS
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import Any

from django.conf import settings
from django.core.mail import EmailMessage, get_connection

from incidents.notifications import outbound
from incidents.notifications.routing import Message


@dataclass(frozen=True)
class Outgoing:
    channel: str
    address: str  # webhook URL, e-mail address or phone number
    message: Message
    chat_format: str = "slack"


@dataclass(frozen=True)
class DeliveryResult:
    outcome: str  # "sent" | "delivered" | "failed"
    provider_response: str
    latency_ms: float
    provider_id: str = ""
    transient: bool = False  # worth retrying (5xx, 429, connection error, timeout)


def _timeout() -> float:
    return float(settings.NOTIFY_HTTP_TIMEOUT_SECONDS)


# How much of a provider's or webhook's answer is kept: enough to say what went wrong, not a
# page of whatever the far end returned (only admins see it, in the deliveries API).
RESPONSE_KEPT_CHARS = 300


def _http_post(
    url: str,
    data: bytes,
    content_type: str,
    headers: dict[str, str] | None = None,
    *,
    guarded: bool = False,
) -> tuple[int, str, float]:
    """(status, body, latency ms); a connection error raises OSError. ``guarded`` (a URL a team
    admin chose): public addresses only, no redirects (RefusedURL otherwise)."""
    request = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": content_type, **(headers or {})}
    )
    started = time.monotonic()
    open_ = outbound.opener().open if guarded else urllib.request.urlopen
    try:
        with open_(request, timeout=_timeout()) as response:
            status, body = response.status, response.read(4000).decode(errors="replace")
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read(4000).decode(errors="replace")
    return status, body, (time.monotonic() - started) * 1000


def _http_result(
    status: int, body: str, latency: float, ok_outcome: str, provider_id: str = ""
) -> DeliveryResult:
    response = f"HTTP {status}: {body[:RESPONSE_KEPT_CHARS]}"
    if 200 <= status < 300:
        return DeliveryResult(ok_outcome, response, latency, provider_id)
    transient = status >= 500 or status == 429
    return DeliveryResult("failed", response, latency, transient=transient)


def chat_payload(outgoing: Outgoing) -> dict[str, Any]:
    message = outgoing.message
    if outgoing.chat_format == "slack":
        return {
            "text": message.first_line,
            "blocks": [
                {"type": "header", "text": {"type": "plain_text", "text": message.first_line}},
                {"type": "section", "text": {"type": "mrkdwn", "text": message.body}},
            ],
        }
    return {"title": message.first_line, "text": message.body}


def send_chat(outgoing: Outgoing) -> DeliveryResult:
    data = json.dumps(chat_payload(outgoing)).encode()
    try:
        outbound.check_url(outgoing.address)  # again: DNS may have changed since it was saved
        status, body, latency = _http_post(outgoing.address, data, "application/json", guarded=True)
    except outbound.RefusedURL as refused:
        return DeliveryResult("failed", f"webhook URL refused: {refused}", 0.0)
    # A webhook that answers 2xx has posted the message: that is delivery for a chat.
    return _http_result(status, body, latency, "delivered")


def send_email(outgoing: Outgoing) -> DeliveryResult:
    backend, sender = settings.NOTIFY_EMAIL_BACKEND, settings.NOTIFY_EMAIL_FROM
    started = time.monotonic()
    connection = get_connection(backend, fail_silently=False, timeout=_timeout())
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


def _provider(path: str, form: dict[str, str]) -> DeliveryResult:
    base = str(settings.NOTIFY_PROVIDER_BASE_URL).rstrip("/")
    if not base:
        return DeliveryResult("failed", "NOTIFY_PROVIDER_BASE_URL is not set", 0.0)
    sid, token = str(settings.NOTIFY_PROVIDER_ACCOUNT_SID), str(settings.NOTIFY_PROVIDER_AUTH_TOKEN)
    auth = base64.b64encode(f"{sid}:{token}".encode()).decode()
    data = urllib.parse.urlencode(form).encode()
    status, body, latency = _http_post(
        f"{base}/{path}",
        data,
        "application/x-www-form-urlencoded",
        {"Authorization": f"Basic {auth}"},
    )
    provider_id, state = "", ""
    try:
        parsed = json.loads(body)
        provider_id, state = str(parsed.get("sid", "")), str(parsed.get("status", ""))
    except (ValueError, AttributeError):
        pass
    ok = "delivered" if state in ("delivered", "completed") else "sent"
    return _http_result(status, body, latency, ok, provider_id)


def receipt_url() -> str:
    """Where the provider reports delivery (``console.api.notifications.ReceiptView``)."""
    base = str(settings.BRAKELINE_PUBLIC_URL).rstrip("/")
    return f"{base}/api/v1/notifications/receipts" if base else ""


def provider_signature(url: str, params: dict[str, str], token: str) -> str:
    """Twilio's request signature: HMAC-SHA1 of the URL and the sorted form, base64."""
    payload = url + "".join(f"{key}{params[key]}" for key in sorted(params))
    digest = hmac.new(token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def _with_callback(form: dict[str, str]) -> dict[str, str]:
    callback = receipt_url()
    return {**form, "StatusCallback": callback} if callback else form


def send_sms(outgoing: Outgoing) -> DeliveryResult:
    sender = str(settings.NOTIFY_PROVIDER_FROM_NUMBER)
    form = {"To": outgoing.address, "From": sender, "Body": outgoing.message.sms()}
    return _provider("Messages.json", _with_callback(form))


def send_phone(outgoing: Outgoing) -> DeliveryResult:
    sender = str(settings.NOTIFY_PROVIDER_FROM_NUMBER)
    message = outgoing.message
    speech = f"Brakeline alert. {message.first_line}. Acknowledge it in the console."
    twiml = f"<Response><Say>{escape(speech)}</Say></Response>"
    form = {"To": outgoing.address, "From": sender, "Twiml": twiml}
    return _provider("Calls.json", _with_callback(form))


ADAPTERS: dict[str, Callable[[Outgoing], DeliveryResult]] = {
    "chat": send_chat,
    "email": send_email,
    "sms": send_sms,
    "phone": send_phone,
}


def send(outgoing: Outgoing) -> DeliveryResult:
    """Send on ``outgoing.channel``; connection errors come back as transient failures."""
    started = time.monotonic()
    try:
        return ADAPTERS[outgoing.channel](outgoing)
    except (TimeoutError, OSError) as error:  # refused, reset, timed out, SMTP disconnect
        latency = (time.monotonic() - started) * 1000
        return DeliveryResult("failed", f"{type(error).__name__}: {error}", latency, transient=True)
