"""Shared by the pages' forms: run a service, turn its ServiceError into the page's message."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal, overload

from django.contrib import messages
from django.http import HttpRequest

from core.errors import InvalidInput, ServiceError


def attempt(request: HttpRequest, done: str, call: Callable[[], Any]) -> bool:
    """Run ``call``; a success or the refusal's sentence becomes the page's message."""
    nul = next((k for k, v in request.POST.items() if "\x00" in k or "\x00" in v), None)
    if nul is not None:  # PostgreSQL text holds no NUL: refuse it here, never a 500
        messages.error(request, f"A NUL character is not allowed ({nul}).")
        return False
    try:
        call()
    except ServiceError as error:
        fields = "".join(f" ({k}: {v})" for k, v in (getattr(error, "fields", None) or {}).items())
        messages.error(request, f"{error.detail}{fields}")
        return False
    messages.success(request, done)
    return True


@overload
def utc_field(request: HttpRequest, name: str, *, required: Literal[True] = True) -> datetime: ...


@overload
def utc_field(request: HttpRequest, name: str, *, required: bool) -> datetime | None: ...


def utc_field(request: HttpRequest, name: str, *, required: bool = True) -> datetime | None:
    """A time typed as ISO ``YYYY-MM-DD HH:MM``, read as UTC (every page says times are UTC).

    The pages use plain text inputs with a pattern rather than ``datetime-local``, whose picker
    shows the browser's locale and time zone while everything else on the console is ISO UTC.
    """
    raw = request.POST.get(name, "").strip()
    if not raw:
        if required:
            raise InvalidInput(f"{name} is required.", fields={name: "a time (UTC)"})
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise InvalidInput(f"Bad {name}.", fields={name: "YYYY-MM-DD HH:MM (UTC)"}) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def int_field(request: HttpRequest, name: str, *, required: bool = True) -> int | None:
    raw = request.POST.get(name, "").strip()
    if not raw and not required:
        return None
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 12:
        raise InvalidInput(f"Bad {name}.", fields={name: "a whole number"})
    return int(raw)
