"""One error format for the whole API: {"error", "detail", "fields"} (docs/protocol.md "Errors")."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from django import db
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.errors import ServiceError

log = logging.getLogger("brakeline.outages")

_DRF_CODES = {
    status.HTTP_400_BAD_REQUEST: "invalid",
    status.HTTP_401_UNAUTHORIZED: "unauthenticated",
    status.HTTP_403_FORBIDDEN: "forbidden",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_406_NOT_ACCEPTABLE: "not_acceptable",
    status.HTTP_409_CONFLICT: "conflict",
    status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: "payload_too_large",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    status.HTTP_429_TOO_MANY_REQUESTS: "rate_limited",
}


def error_response(error: ServiceError) -> Response:
    response = Response(error.as_body(), status=error.status)
    if error.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="brakeline"'
    return response


def _flatten(detail: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(detail, dict):
        fields: dict[str, str] = {}
        for key, value in detail.items():
            fields.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
        return fields
    if isinstance(detail, list):
        if all(not isinstance(item, dict | list) for item in detail):
            return {prefix or "non_field_errors": " ".join(str(item) for item in detail)}
        fields = {}
        for index, item in enumerate(detail):
            fields.update(_flatten(item, f"{prefix}[{index}]"))
        return fields
    return {prefix or "non_field_errors": str(detail)}


# SQLSTATE read_only_sql_transaction: a write reached a read-only database.
READ_ONLY = "25006"


# SQLSTATEs of a transaction PostgreSQL refused because of another one (deadlock_detected,
# serialization_failure, lock_not_available): not an outage, but the same answer — nothing
# was written, retry — so the client's retry loop applies. Named apart in the body and the
# log, because "unreachable" sent people looking at a database that was up.
CONFLICT_STATES = frozenset({"40P01", "40001", "55P03"})
CONFLICT = "database (a conflicting transaction)"


# A database that has just failed to answer is not asked again for a moment: agent requests
# and health checks in between answer 503 at once, instead of each waiting the connection
# pool's timeout while PostgreSQL is away (an agent backs off and retries anyway).
DATABASE_AWAY_SECONDS = 1.0
_database_failed_at = [-math.inf]


def _unreachable(exc: BaseException | None) -> bool:
    """No connection at all (no SQLSTATE: refused, timed out, the pool empty), or the server
    says it is going away (class 08, 57P): not an answer such as a read-only refusal."""
    sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(("08", "57P"))


def database_recently_away() -> bool:
    """The database failed to answer within the last ``DATABASE_AWAY_SECONDS``."""
    return time.monotonic() - _database_failed_at[0] < DATABASE_AWAY_SECONDS


def outage_part(exc: BaseException | None) -> str | None:
    """The part that is down when ``exc`` says the database or Redis cannot be reached (or the
    database refused the transaction for a conflicting one); logged once per answer, with the
    driver's own error, since the 503 itself says nothing of the cause."""
    part = _outage_part(exc)
    if part == "database" and _unreachable(exc):
        _database_failed_at[0] = time.monotonic()
    if part is not None:
        cause = exc.__cause__ or exc if exc is not None else exc
        said = " ".join(str(cause).split())[:600]  # with PostgreSQL's DETAIL: who waits on whom
        log.warning("answered 503, %s: %s: %s", part, type(cause).__name__, said)
    return part


def _outage_part(exc: BaseException | None) -> str | None:
    sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
    if isinstance(exc, db.Error) and sqlstate in CONFLICT_STATES:
        return CONFLICT
    if isinstance(exc, db.OperationalError | db.InterfaceError):
        return "database"
    if isinstance(exc, db.Error) and sqlstate == READ_ONLY:
        return "database (read-only)"  # a standby, or default_transaction_read_only
    try:
        import redis
    except ImportError:  # pragma: no cover - the server mode always has it
        return None
    if isinstance(exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError):
        return "redis"
    return None


def outage_response(part: str) -> Response:
    """503, not 500: the request was fine and nothing of it was written (its transaction
    rolled back), so a client retries it without limit (an agent drops a batch answered 500
    five times), and the health endpoint says which part is down."""
    response = Response(outage_body(part), status=503)
    response["Retry-After"] = "1"
    return response


def exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, ServiceError):
        return error_response(exc)
    part = outage_part(exc)
    if part is not None:
        return outage_response(part)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = _DRF_CODES.get(response.status_code, "error")
    if isinstance(exc, exceptions.ValidationError):
        body = {"error": code, "detail": "The request was refused.", "fields": _flatten(exc.detail)}
    elif isinstance(exc, exceptions.ParseError):
        # A body DRF's parsers could not read (a form, an unsupported charset): name it.
        detail = str(exc.detail)
        body = {"error": code, "detail": detail, "fields": {"body": detail}}
    elif isinstance(exc, exceptions.UnsupportedMediaType):
        detail = str(exc.detail)
        body = {"error": code, "detail": detail, "fields": {"Content-Type": detail}}
    else:
        # An APIException reads as its detail.
        body = {"error": code, "detail": str(exc), "fields": {}}
    response.data = body
    return response


def outage_body(part: str) -> dict:
    """The answer's body while ``part`` is down (docs/protocol.md "Errors"): retry."""
    if part == CONFLICT:
        detail = "The console's database refused this as conflicting with another request; retry."
    else:
        detail = f"The console's {part} is unreachable; retry."
    return {"error": "unavailable", "detail": detail, "fields": {}}


def server_error(request: Any) -> Any:
    """The project's 500 (``handler500``), called while the exception is being handled: an
    outage met outside a DRF view (a middleware's session or sign-in lookup, a page) is a 503
    with ``Retry-After`` as in the API, because an agent gives up on a batch answered 500 five
    times and retries a 503 without limit; anything else is Django's own 500."""
    import sys

    from django.http import JsonResponse
    from django.views.defaults import server_error as django_server_error

    part = outage_part(sys.exc_info()[1])
    if part is None:
        return django_server_error(request)
    response = JsonResponse(outage_body(part), status=503)
    response["Retry-After"] = "1"
    return response


def not_found(request: Any, exception: Exception | None = None) -> Any:
    """The project's 404 (``handler404``): under /api/ the API's error body, else the page."""
    from django.http import JsonResponse
    from django.views.defaults import page_not_found

    if request.path.startswith("/api/"):
        body = {"error": "not_found", "detail": "There is no such API endpoint.", "fields": {}}
        return JsonResponse(body, status=404)
    return page_not_found(request, exception)
