"""What a page carries so that it can be answered, and how an answer proves itself.

An alert's SMS says "Reply 1 to acknowledge" with a short reply code, a call asks for the key 1
(the code rides in the keypress callback's address), and a chat message carries a button whose
link is a signed, expiring, one-time token naming the page. The provider's replies and
keypresses are signed with the shared secret ``NOTIFY_REPLY_SECRET``: HMAC-SHA256 over the
timestamp, the callback's path and the raw body (docs/security.md "Answers to a page").

The signing and parsing here are pure (no database); ``replies`` applies them.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.conf import settings
from django.core import signing

REPLY_CHANNELS = ("sms", "phone", "chat")
# No 0/O, 1/I/L: a code read off a lock screen and typed back with a thumb.
CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 5
ACKNOWLEDGE_WORDS = ("1", "ack", "acknowledge")
SIGNATURE_HEADER = "X-Brakeline-Signature"
TIMESTAMP_HEADER = "X-Brakeline-Timestamp"
_LINK_SALT = "brakeline.page-acknowledge-link"


class BadReply(ValueError):
    """An answer that cannot be read; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def new_reply_code() -> str:
    return "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))


def sms_reply_text(code: str) -> str:
    return f"Reply 1 {code} to acknowledge." if code else ""


def parse_sms_reply(body: str) -> str:
    """The reply code of an SMS answer ("1", "1 K7Q2P", "ack k7q2p"); "" when none was given
    (then the latest page to that number is meant). BadReply when it does not acknowledge."""
    words = body.strip().split()
    if not words or words[0].lower() not in ACKNOWLEDGE_WORDS:
        raise BadReply("Body", "reply 1 (optionally followed by the page's code) to acknowledge")
    if len(words) > 2:
        raise BadReply("Body", "reply 1 and at most the page's code")
    code = words[1].upper() if len(words) == 2 else ""
    if code and (len(code) != CODE_LENGTH or any(c not in CODE_ALPHABET for c in code)):
        raise BadReply("Body", f"{words[1]!r} is not a reply code")
    return code


def reply_signature(secret: str, timestamp: str, path: str, body: bytes) -> str:
    """``v1=`` and the hex HMAC-SHA256 of ``timestamp\\npath\\nbody`` under ``secret``."""
    message = timestamp.encode() + b"\n" + path.encode() + b"\n" + body
    return "v1=" + hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def check_signature(
    secret: str, timestamp: str, signature: str, path: str, body: bytes, now: float
) -> None:
    """BadReply naming the header when the request is unsigned, forged or too old."""
    if not secret:
        raise BadReply(SIGNATURE_HEADER, "replies are not enabled (no shared secret is set)")
    try:
        sent = float(timestamp)
    except ValueError:
        raise BadReply(TIMESTAMP_HEADER, "must be the signing time in Unix seconds") from None
    expected = reply_signature(secret, timestamp, path, body)
    if not hmac.compare_digest(expected, signature):
        raise BadReply(SIGNATURE_HEADER, "does not match the body, path and timestamp")
    if abs(now - sent) > float(settings.NOTIFY_REPLY_MAX_AGE_SECONDS):
        raise BadReply(TIMESTAMP_HEADER, "is too far from now (a replayed or delayed request)")


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def ack_link_token(delivery_id: int) -> str:
    return signing.dumps({"d": delivery_id}, salt=_LINK_SALT, compress=True)


def read_ack_link_token(token: str) -> int:
    """The delivery a link names; BadReply when forged, malformed or expired."""
    max_age = timedelta(seconds=float(settings.NOTIFY_ACK_LINK_MAX_AGE_SECONDS))
    try:
        value = signing.loads(token, salt=_LINK_SALT, max_age=max_age)
    except signing.SignatureExpired:
        raise BadReply("token", "this acknowledge link has expired") from None
    except signing.BadSignature:
        raise BadReply("token", "this acknowledge link is not one the console signed") from None
    delivery_id = value.get("d") if isinstance(value, dict) else None
    if not isinstance(delivery_id, int):
        raise BadReply("token", "this acknowledge link names no page")
    return delivery_id


def ack_link(delivery_id: int) -> str:
    base = str(settings.BRAKELINE_PUBLIC_URL).rstrip("/")
    return f"{base}/ack/{ack_link_token(delivery_id)}/"
