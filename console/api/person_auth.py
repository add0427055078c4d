"""How people reach the console API: a browser session (with CSRF) or a personal token.

``PersonView`` is the base of every person-facing endpoint: session authentication keeps DRF's
CSRF check on unsafe methods; a personal token (``Authorization: Token <token>``, or ``Bearer``
with the ``bkp_`` prefix) needs none, because no browser sends it on its own.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from django.http import HttpRequest
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import OpenApiResponse
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    get_authorization_header,
)
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.views import APIView

from console.api.agent_schema import ErrorDoc
from console.api.parsers import PERSON_PARSERS
from core.errors import InvalidInput, Unauthenticated
from incidents.models import PERSONAL_TOKEN_PREFIX
from incidents.teams.audit import AuditContext
from incidents.teams.users import User


class PersonalTokenAuthentication(BaseAuthentication):
    """``Token <token>``, or ``Bearer bkp_…``; any other header is left to the next class."""

    def authenticate(self, request):
        header = get_authorization_header(request)
        if not header:
            return None
        scheme, _, raw = header.decode("latin-1").partition(" ")
        raw = raw.strip()
        ours = scheme.lower() == "token" or (
            scheme.lower() == "bearer" and raw.startswith(PERSONAL_TOKEN_PREFIX)
        )
        if not ours:
            return None
        if not raw:
            raise Unauthenticated("The Authorization header must be 'Token <token>'.")
        from incidents.teams.tokens import authenticate_personal_token  # models: after app loading

        return authenticate_personal_token(raw), raw

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (with this challenge) rather than 403 when nobody is logged in.
        return 'Token realm="brakeline"'


class PersonalTokenScheme(OpenApiAuthenticationExtension):
    target_class = "console.api.person_auth.PersonalTokenAuthentication"
    name = "personalToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <personal token>` (or `Bearer bkp_…`). Create one with "
            "`POST /api/v1/tokens` or `manage.py create_token --user NAME`.",
        }


def nul_field(value: Any, prefix: str = "") -> str | None:
    """The first field (``a.b[2]``) whose name or text holds a NUL character, else None."""
    if isinstance(value, str):
        return prefix or "body" if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if "\x00" in str(key):
                return name
            found = nul_field(item, name)
            if found:
                return found
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = nul_field(item, f"{prefix}[{index}]")
            if found:
                return found
    return None


class PersonView(APIView):
    authentication_classes = [PersonalTokenAuthentication, SessionAuthentication]
    # JSON bodies as strict as the agent's: a 400 naming the field, never a 500.
    parser_classes = PERSON_PARSERS
    permission_classes = [IsAuthenticated]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        # No text of ours holds a NUL (PostgreSQL refuses it): a 400 naming the field, before
        # any service stores or filters by it.
        for key in request.query_params:
            values = request.query_params.getlist(key)
            if "\x00" in key or any("\x00" in v for v in values):
                raise InvalidInput("A NUL character is not allowed.", fields={key: "no NUL"})
        if request.method not in ("GET", "HEAD", "OPTIONS", "DELETE"):
            field_name = nul_field(request.data)
            if field_name:
                raise InvalidInput("A NUL character is not allowed.", fields={field_name: "no NUL"})


def signed_in(request: Request | HttpRequest) -> User:
    """The person behind a request that only a signed-in person reaches (``IsAuthenticated``,
    ``login_required``): the ``User`` the services that act take. Anybody else is refused as
    not signed in, never served as nobody."""
    user = request.user
    if not isinstance(user, User):
        raise Unauthenticated("Sign in, or send a personal token.")
    return user


def audit_context(request: Request | HttpRequest) -> AuditContext:
    """Who asked from where, for the audit row: the API's requests and the pages' forms alike
    (a page's request has no DRF authenticator: a session)."""
    authenticator = getattr(request, "successful_authenticator", None)
    via = "token" if isinstance(authenticator, PersonalTokenAuthentication) else "session"
    address = request.META.get("REMOTE_ADDR") or None
    try:
        address = str(ipaddress.ip_address(address)) if address else None
    except ValueError:
        address = None  # e.g. a unix socket path behind a proxy
    return AuditContext(
        remote_addr=address, user_agent=request.META.get("HTTP_USER_AGENT", ""), via=via
    )


def error_responses(*codes: int, texts: dict[int, str] | None = None) -> dict[int, OpenApiResponse]:
    """The error body (docs/protocol.md "Errors") for each of ``codes``, for extend_schema;
    ``texts``: an endpoint's own descriptions of some of them."""
    described = {
        400: "Invalid body; `fields` says which field and why.",
        401: "Not logged in, or an unknown or revoked token.",
        403: "Refused by the authority matrix (`detail` says why), or a missing CSRF token.",
        404: "No such object in your teams (another team's ids look like missing ones).",
        409: "Somebody changed it first (already decided, already paused, …).",
    }
    described.update(texts or {})
    return {code: OpenApiResponse(ErrorDoc, description=described[code]) for code in codes}
