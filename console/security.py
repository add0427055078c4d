"""HTTP hardening that Django 5.2 does not do itself: the pages' Content-Security-Policy, and
the client's address for counting failed sign-ins (django-axes) behind a TLS proxy."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

# The one inline <style> element Swagger UI (drf-spectacular-sidecar's bundle) writes into the
# API docs page at run time; allowed there by its hash, nowhere else. A new bundle that writes
# another one shows as a CSP error in tests/console/browser/test_api_docs_browser.py.
SWAGGER_UI_STYLE = "'sha256-MMpT0iDxyjALd9PdfepImGX3DBfJPXZ4IlDWdPAgtn0='"


def _policy(request: HttpRequest) -> str:
    host = request.get_host()
    websocket = f"wss://{host}" if request.is_secure() else f"ws://{host} wss://{host}"
    return str(settings.CONTENT_SECURITY_POLICY).format(websocket=websocket)


def api_docs_policy(request: HttpRequest) -> str:
    """The pages' policy, with Swagger UI's own inline style allowed by its hash."""
    return _policy(request).replace(
        "style-src-elem 'self'", f"style-src-elem 'self' {SWAGGER_UI_STYLE}", 1
    )


def _add_policy(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    if "Content-Security-Policy" not in response:
        try:
            response["Content-Security-Policy"] = _policy(request)
        except DisallowedHost:  # a host Django refuses: the answer is already a 400
            response["Content-Security-Policy"] = _policy_without_host()
    return response


def _policy_without_host() -> str:
    return str(settings.CONTENT_SECURITY_POLICY).format(websocket="")


@sync_and_async_middleware
def content_security_policy_middleware(
    get_response: Callable[[HttpRequest], Any],
) -> Callable[[HttpRequest], HttpResponse | Awaitable[HttpResponse]]:
    if iscoroutinefunction(get_response):

        async def middleware_async(request: HttpRequest) -> HttpResponse:
            return _add_policy(request, await get_response(request))

        return middleware_async

    def middleware(request: HttpRequest) -> HttpResponse:
        return _add_policy(request, get_response(request))

    return middleware


def client_ip(request: Any) -> str | None:
    """The address failed sign-ins are counted by: the peer's, or behind the TLS proxy
    (BRAKELINE_TLS_PROXY) the last address of X-Forwarded-For, the one the proxy saw."""
    meta = getattr(request, "META", {}) or {}
    if getattr(settings, "TLS_PROXY", False):
        forwarded = [p.strip() for p in str(meta.get("HTTP_X_FORWARDED_FOR", "")).split(",")]
        forwarded = [p for p in forwarded if p]
        if forwarded:
            return forwarded[-1]
    return meta.get("REMOTE_ADDR")
