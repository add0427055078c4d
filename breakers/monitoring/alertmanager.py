"""Alertmanager's webhook payload (version 4), parsed strictly — pure Python, no Django.

Every input is hostile until parsed: a field of the wrong type, a label that is not a string,
an unparsable time or a fingerprint that is not hexadecimal is named in ``PayloadError.fields``
(the view answers 400 with them) and nothing is written. Fields Alertmanager may add in later
versions are ignored; the ones Brakeline reads must be exactly what version 4 says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

MAX_ALERTS = 1000  # Alertmanager's default max_alerts is 0 (all); a group of 1000 is plenty
MAX_LABELS = 64
MAX_LABEL_NAME = 200
MAX_LABEL_VALUE = 1000
MAX_ANNOTATION_VALUE = 4000
STATUSES = ("firing", "resolved")
_FINGERPRINT = re.compile(r"[0-9a-f]{1,64}")
# RFC 3339 as Go writes it: up to nanoseconds, "Z" or an offset.
_TIME = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})"
)
# Go's zero time: an alert still firing has no end.
_ZERO_TIME_YEAR = 1


class PayloadError(ValueError):
    def __init__(self, detail: str, fields: dict[str, str]):
        super().__init__(detail)
        self.detail, self.fields = detail, fields


@dataclass(frozen=True)
class ExternalAlertIn:
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime | None  # None: Go's zero time (still firing, no end known)
    fingerprint: str
    generator_url: str

    @property
    def alertname(self) -> str:
        return self.labels["alertname"]


@dataclass(frozen=True)
class WebhookIn:
    group_key: str
    status: str
    truncated_alerts: int
    receiver: str
    alerts: tuple[ExternalAlertIn, ...]


def parse_webhook(body: bytes) -> WebhookIn:
    """The payload, or PayloadError naming every field that is wrong."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:  # nested 10,000 deep
        raise PayloadError(
            f"The body is not JSON: {error}"[:300], {"body": "must be JSON"}
        ) from None
    if not isinstance(data, dict):
        raise PayloadError("The payload must be a JSON object.", {"body": "must be an object"})
    errors: dict[str, str] = {}
    if data.get("version") != "4":
        errors["version"] = 'must be "4" (Alertmanager webhook version 4)'
    group_key = _string(data.get("groupKey"), errors, "groupKey", 10_000)
    status = _status(data.get("status"), errors, "status")
    truncated = data.get("truncatedAlerts", 0)
    if not (isinstance(truncated, int) and not isinstance(truncated, bool) and truncated >= 0):
        errors["truncatedAlerts"] = "must be an integer >= 0"
        truncated = 0
    receiver = _string(data.get("receiver", ""), errors, "receiver", 1000)
    alerts = _alerts(data.get("alerts"), errors)
    if errors:
        raise PayloadError("The Alertmanager payload is invalid; nothing was written.", errors)
    return WebhookIn(group_key or "", status or "", truncated, receiver or "", alerts)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"bare {name} is not JSON")


def _alerts(value: object, errors: dict[str, str]) -> tuple[ExternalAlertIn, ...]:
    if not isinstance(value, list):
        errors["alerts"] = "must be a list"
        return ()
    if len(value) > MAX_ALERTS:
        errors["alerts"] = f"must hold at most {MAX_ALERTS} alerts (got {len(value)})"
        return ()
    parsed = []
    for index, item in enumerate(value):
        alert = _alert(item, errors, f"alerts[{index}]")
        if alert is not None:
            parsed.append(alert)
    return tuple(parsed)


def _alert(item: object, errors: dict[str, str], path: str) -> ExternalAlertIn | None:
    if not isinstance(item, dict):
        errors[path] = "must be an object"
        return None
    before = len(errors)
    status = _status(item.get("status"), errors, f"{path}.status")
    labels = _mapping(item.get("labels"), errors, f"{path}.labels", MAX_LABEL_VALUE)
    if labels is not None and not labels.get("alertname"):
        errors[f"{path}.labels.alertname"] = "is required (the alerting rule's name)"
    annotations = _mapping(
        item.get("annotations", {}), errors, f"{path}.annotations", MAX_ANNOTATION_VALUE
    )
    starts_at = _time(item.get("startsAt"), errors, f"{path}.startsAt")
    ends_at = _time(item.get("endsAt", "0001-01-01T00:00:00Z"), errors, f"{path}.endsAt")
    fingerprint = item.get("fingerprint")
    if not (isinstance(fingerprint, str) and _FINGERPRINT.fullmatch(fingerprint)):
        errors[f"{path}.fingerprint"] = "must be Alertmanager's hexadecimal fingerprint"
    generator = _string(item.get("generatorURL", ""), errors, f"{path}.generatorURL", 2000)
    if len(errors) > before or labels is None or annotations is None or starts_at is None:
        return None
    if ends_at is not None and ends_at.year == _ZERO_TIME_YEAR:
        ends_at = None
    assert isinstance(fingerprint, str) and status is not None
    return ExternalAlertIn(
        status, labels, annotations, starts_at, ends_at, fingerprint, generator or ""
    )


def _status(value: object, errors: dict[str, str], path: str) -> str | None:
    if value not in STATUSES:
        errors[path] = "must be firing or resolved"
        return None
    return str(value)


def _string(value: object, errors: dict[str, str], path: str, limit: int) -> str | None:
    if not isinstance(value, str):
        errors[path] = "must be a string"
        return None
    if len(value) > limit:
        errors[path] = f"must be at most {limit} characters"
        return None
    if "\x00" in value or any("\ud800" <= c <= "\udfff" for c in value):
        errors[path] = "must not hold NUL characters or lone surrogates"
        return None
    return value


def _mapping(value: object, errors: dict[str, str], path: str, limit: int) -> dict | None:
    if not isinstance(value, dict):
        errors[path] = "must be an object of strings"
        return None
    if len(value) > MAX_LABELS:
        errors[path] = f"must have at most {MAX_LABELS} entries"
        return None
    result: dict[str, str] = {}
    for name, text in value.items():
        if not (0 < len(name) <= MAX_LABEL_NAME) or _string(name, {}, "", MAX_LABEL_NAME) is None:
            errors[path] = f"has an invalid name {name[:40]!r}"
            return None
        checked = _string(text, errors, f"{path}.{name[:MAX_LABEL_NAME]}", limit)
        if checked is None:
            return None
        result[name] = checked
    return result


def _time(value: object, errors: dict[str, str], path: str) -> datetime | None:
    match = _TIME.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        errors[path] = "must be an RFC 3339 time (2026-01-02T03:04:05Z)"
        return None
    day, clock, fraction, zone = match.groups()
    micro = (fraction or "0")[:6].ljust(6, "0")
    offset = "+00:00" if zone in ("Z", "z") else zone
    try:
        return datetime.fromisoformat(f"{day}T{clock}.{micro}{offset}").astimezone(UTC)
    except (ValueError, OverflowError):  # 2026-02-30, or year 1 with an offset east of UTC
        errors[path] = "is not a valid date and time"
        return None
