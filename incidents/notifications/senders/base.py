"""What every channel shares: the message going out, the result coming back, and the HTTP
POST (with its timeout and the part of the answer that is kept)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from django.conf import settings

from incidents.notifications import outbound
from incidents.notifications.routing import Message


@dataclass(frozen=True)
class Outgoing:
    channel: str
    address: str  # webhook URL, e-mail address or phone number
    message: Message
    chat_format: str = "slack"
    # The same on every attempt of one delivery: a provider that honours the Idempotency-Key
    # header then pages once even when a worker died between its send and its record.
    idempotency_key: str = ""
    # How this page is answered (an alert's page only): the SMS's reply code, which also rides
    # in a call's keypress callback, and a chat message's one-time acknowledge link.
    reply_code: str = ""
    ack_link: str = ""

    def key_header(self) -> dict[str, str]:
        return {"Idempotency-Key": self.idempotency_key} if self.idempotency_key else {}


@dataclass(frozen=True)
class DeliveryResult:
    outcome: str  # "sent" | "delivered" | "failed"
    provider_response: str
    latency_ms: float
    provider_id: str = ""
    transient: bool = False  # worth retrying (5xx, 429, connection error, timeout)


def timeout() -> float:
    return float(settings.NOTIFY_HTTP_TIMEOUT_SECONDS)


# How much of a provider's or webhook's answer is kept: enough to say what went wrong, not a
# page of whatever the far end returned (only admins see it, in the deliveries API).
RESPONSE_KEPT_CHARS = 300


def http_post(
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
        with open_(request, timeout=timeout()) as response:
            status, body = response.status, response.read(4000).decode(errors="replace")
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read(4000).decode(errors="replace")
    return status, body, (time.monotonic() - started) * 1000


def http_result(
    status: int, body: str, latency: float, ok_outcome: str, provider_id: str = ""
) -> DeliveryResult:
    response = f"HTTP {status}: {body[:RESPONSE_KEPT_CHARS]}"
    if 200 <= status < 300:
        return DeliveryResult(ok_outcome, response, latency, provider_id)
    transient = status >= 500 or status == 429
    return DeliveryResult("failed", response, latency, transient=transient)
