"""Query parameters of the console API, hostile until parsed: one parser for whole numbers and
one for moments, each refusing with a 400 that names the parameter.

``int()`` alone is not a parser: it takes ``" +5 "``, ``"1_000"`` and other scripts' digits,
and it raises ``ValueError`` past 4,300 digits; a value beyond a bigint column (or a datetime
that overflows when made UTC) then fails inside the database driver. Here a whole number is an
optional ``-`` and ASCII digits, bounded in length and in range, and a moment lies within
:data:`EARLIEST` … :data:`LATEST` in UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, time, timedelta
from typing import overload

from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime
from rest_framework.request import Request

from core.errors import InvalidInput

# Ids are bigint primary keys: 1 … 2**63-1.
MAX_ID = 2**63 - 1
MIN_BIGINT = -(2**63)
# An optional minus sign and at most 19 ASCII digits (2**63-1 has 19): nothing else, no
# spaces, no "+", no "_" and no other scripts' digits. The range is checked after.
_WHOLE = re.compile(r"-?[0-9]{1,19}")
# The moments a parameter may name, in UTC: anything later overflows when converted (the
# embedded SQLite mode stores UTC text) or when a period is computed from it.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9998, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


def parse_int(raw: str, name: str, *, minimum: int, maximum: int, what: str = "") -> int:
    """``raw`` as a whole number from ``minimum`` to ``maximum``, or a 400 naming ``name``.
    ``what`` describes it in the refusal (e.g. "a job id")."""
    value = int(raw) if _WHOLE.fullmatch(raw) else None
    if value is None or not minimum <= value <= maximum:
        said = f"{what}: " if what else ""
        raise InvalidInput(
            f"Bad {name}.",
            fields={name: f"{said}a whole number from {minimum} to {maximum}"},
        )
    return value


@overload
def int_param(
    request: Request,
    name: str,
    *,
    minimum: int = ...,
    maximum: int = ...,
    default: int,
    blank_is_absent: bool = ...,
    what: str = ...,
) -> int: ...


@overload
def int_param(
    request: Request,
    name: str,
    *,
    minimum: int = ...,
    maximum: int = ...,
    default: None = ...,
    blank_is_absent: bool = ...,
    what: str = ...,
) -> int | None: ...


def int_param(
    request: Request,
    name: str,
    *,
    minimum: int = MIN_BIGINT,
    maximum: int = MAX_ID,
    default: int | None = None,
    blank_is_absent: bool = False,
    what: str = "",
) -> int | None:
    """The query parameter ``name`` as a whole number in ``minimum`` … ``maximum``;
    ``default`` when it is absent (or empty, with ``blank_is_absent``)."""
    raw = request.query_params.get(name)
    if raw is None or (blank_is_absent and raw == ""):
        return default
    return parse_int(raw, name, minimum=minimum, maximum=maximum, what=what)


def id_param(request: Request, name: str, *, what: str = "") -> int | None:
    """The query parameter ``name`` as an id (1 … 2**63-1), None when absent."""
    return int_param(request, name, minimum=1, maximum=MAX_ID, what=what or f"a {name} id")


MAX_OFFSET = timedelta(hours=14)


def parse_moment(text: str, name: str, *, dates: bool = True) -> datetime:
    """``text`` as an ISO 8601 date-time (UTC when naive) or, with ``dates``, a date (its
    midnight, UTC), within :data:`EARLIEST` … :data:`LATEST` once in UTC; else a 400 naming
    ``name``. The moment keeps the offset it was given with."""
    said = "an ISO date or date-time" if dates else "an ISO 8601 date-time"
    try:
        moment = parse_datetime(text)
        if moment is None and dates:
            day = parse_date(text)
            moment = datetime.combine(day, time.min) if day is not None else None
    except ValueError:  # well formed but no such day or time (2026-02-30, 25:00)
        moment = None
    if moment is None:
        raise InvalidInput(f"Bad {name}.", fields={name: said})
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    offset = moment.utcoffset()
    if offset is not None and abs(offset) > MAX_OFFSET:
        # Python takes offsets up to ±23:59, PostgreSQL's timestamptz only to ±15:59; real
        # zones span -12:00 to +14:00.
        raise InvalidInput(
            f"Bad {name}.", fields={name: f"{said} with a UTC offset from -14:00 to +14:00"}
        )
    try:
        in_utc = moment.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00-05:00 is in the year 10000 in UTC
        in_utc = None
    if in_utc is None or not EARLIEST <= in_utc <= LATEST:
        raise InvalidInput(
            f"Bad {name}.",
            fields={name: f"{said} from {EARLIEST:%Y-%m-%d} to {LATEST:%Y-%m-%d} (UTC)"},
        )
    return moment


def length_exceeds(declared: str, limit: int) -> bool:
    """A ``Content-Length`` header's value says more than ``limit`` bytes. A malformed one
    (``²``, a sign, thousands of digits, which ``int()`` refuses) says nothing: every read is
    bounded anyway."""
    if not (declared.isascii() and declared.isdigit()):
        return False
    digits = declared.lstrip("0") or "0"
    return len(digits) > 19 or int(digits) > limit  # at most 19 digits: int() takes them
