"""Errors that services raise and every entry point turns into one error format.

The format is described in docs/protocol.md "Errors":

``{"error": "<code>", "detail": "<human sentence>", "fields": {...}}`` with the status code
carried by the exception, so a REST view, a websocket consumer and a management command all
report the same refusal the same way.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


class ServiceError(Exception):
    status = 400
    code = "invalid"

    def __init__(
        self, detail: str, *, fields: dict[str, str] | None = None, code: str | None = None
    ):
        super().__init__(detail)
        self.detail = detail
        self.fields = fields or {}
        if code is not None:
            self.code = code

    def as_body(self) -> dict:
        return {"error": self.code, "detail": self.detail, "fields": self.fields}


class InvalidInput(ServiceError):
    status = 400
    code = "invalid"


class Unauthenticated(ServiceError):
    status = 401
    code = "unauthenticated"


class Forbidden(ServiceError):
    status = 403
    code = "forbidden"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class PayloadTooLarge(ServiceError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status = 415
    code = "unsupported_media_type"


def or_raise(outcome: T | ServiceError) -> T:
    """An outcome answered one of several (a bundle's part), as a caller of one expects it:
    the refusal raised."""
    if isinstance(outcome, ServiceError):
        raise outcome
    return outcome
