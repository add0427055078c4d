"""The Twilio-style provider that SMS and phone calls go through: a form POST to
``{base}/Messages.json`` or ``{base}/Calls.json`` with basic auth, a delivery receipt URL, and
the provider's request signature on those receipts (BRAKELINE_NOTIFY_PROVIDER_* settings)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse

from django.conf import settings

from incidents.notifications.senders.base import DeliveryResult, http_post, http_result


def post_to_provider(
    path: str, form: dict[str, str], headers: dict[str, str] | None = None
) -> DeliveryResult:
    base = str(settings.NOTIFY_PROVIDER_BASE_URL).rstrip("/")
    if not base:
        return DeliveryResult("failed", "NOTIFY_PROVIDER_BASE_URL is not set", 0.0)
    sid, token = str(settings.NOTIFY_PROVIDER_ACCOUNT_SID), str(settings.NOTIFY_PROVIDER_AUTH_TOKEN)
    auth = base64.b64encode(f"{sid}:{token}".encode()).decode()
    data = urllib.parse.urlencode(form).encode()
    status, body, latency = http_post(
        f"{base}/{path}",
        data,
        "application/x-www-form-urlencoded",
        {"Authorization": f"Basic {auth}", **(headers or {})},
    )
    provider_id, state = "", ""
    try:
        parsed = json.loads(body)
        provider_id, state = str(parsed.get("sid", "")), str(parsed.get("status", ""))
    except (ValueError, AttributeError):
        pass
    ok = "delivered" if state in ("delivered", "completed") else "sent"
    return http_result(status, body, latency, ok, provider_id)


def receipt_url() -> str:
    """Where the provider reports delivery (``console.api.notifications.ReceiptView``)."""
    base = str(settings.BRAKELINE_PUBLIC_URL).rstrip("/")
    return f"{base}/api/v1/notifications/receipts" if base else ""


def provider_signature(url: str, params: dict[str, str], token: str) -> str:
    """Twilio's request signature: HMAC-SHA1 of the URL and the sorted form, base64."""
    payload = url + "".join(f"{key}{params[key]}" for key in sorted(params))
    digest = hmac.new(token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def with_callback(form: dict[str, str]) -> dict[str, str]:
    callback = receipt_url()
    return {**form, "StatusCallback": callback} if callback else form
