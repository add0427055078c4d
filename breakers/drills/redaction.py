"""Scrubbing the console's secrets from anything a drill shows to people (named so as not to
shadow the standard library's ``secrets`` for the workload scripts run from this folder).

A drill's output (the workload's log tail in its error, a check's detail) is read by every
member of the team. Whatever a command managed to print, the values of the console's secrets
never reach them: the secret key, the database and Redis URLs (and their passwords), provider
tokens, and any variable of the console's environment whose name says it is a secret.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from django.conf import settings

SECRET_NAME = re.compile(r"SECRET|TOKEN|PASSWORD|PASSWD|KEY|DATABASE_URL|REDIS_URL|DSN|CREDENTIAL")
MIN_LENGTH = 6  # shorter values ("true", "1") would redact ordinary words
REDACTED = "<redacted>"


def console_secrets() -> list[str]:
    """The secret values, longest first (a URL before the password inside it)."""
    values = {settings.SECRET_KEY, settings.NOTIFY_PROVIDER_AUTH_TOKEN}
    values |= {value for name, value in os.environ.items() if SECRET_NAME.search(name.upper())}
    for value in list(values):
        if "://" in value:
            values.add(urlsplit(value).password or "")
    password = settings.DATABASES["default"].get("PASSWORD") or ""
    values.add(str(password))
    return sorted((v for v in values if len(v) >= MIN_LENGTH), key=len, reverse=True)


def scrub(text: str) -> str:
    for value in console_secrets():
        if value in text:
            text = text.replace(value, REDACTED)
    return text
