"""Authentication and rate limiting of training agents (one bearer token = one job)."""

from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from console.ratelimit import agent_wait_seconds
from core.errors import Unauthenticated
from incidents.agent_tokens import authenticate_agent
from incidents.models import Job

# The ASGI scope key under which console.agent_gate leaves (token, job) once it has
# authenticated a request's token; nothing outside the server process can set a scope key.
GATE_AUTHENTICATED = "brakeline.agent_authenticated"


@dataclass
class AgentPrincipal:
    """The identity behind an agent request: the job its token belongs to."""

    job: Job
    is_authenticated: bool = True

    @property
    def pk(self) -> int:
        return self.job.pk


def bearer_token(header_value: bytes | str) -> str | None:
    if isinstance(header_value, bytes):
        header_value = header_value.decode("latin-1")
    scheme, _, token = header_value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def required_bearer_token(header: bytes | str | None) -> str:
    """The agent token of an Authorization header; 401 (with the reason) when there is none."""
    if not header:
        raise Unauthenticated(
            "No agent token: send 'Authorization: Bearer <token>'.", code="missing_token"
        )
    token = bearer_token(header)
    if token is None:
        raise Unauthenticated(
            "The Authorization header must be 'Bearer <token>'.", code="malformed_token"
        )
    return token


def agent_job(request: Request) -> Job:
    """The job whose agent token authenticated the request (``AgentTokenAuthentication``)."""
    principal = request.user
    if not isinstance(principal, AgentPrincipal):
        raise Unauthenticated("No agent token: send 'Authorization: Bearer <token>'.")
    return principal.job


class AgentTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        token = required_bearer_token(get_authorization_header(request))
        scope = getattr(request._request, "scope", None) or {}
        gated = scope.get(GATE_AUTHENTICATED)
        # console.agent_gate has authenticated this very request's token: no second lookup.
        job = gated[1] if gated is not None and gated[0] == token else authenticate_agent(token)
        return AgentPrincipal(job=job), token

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (with this challenge) rather than 403 when no token is sent.
        return 'Bearer realm="brakeline"'


class AgentTokenScheme(OpenApiAuthenticationExtension):
    """The agent endpoints' security scheme in the OpenAPI schema: the job's bearer token."""

    target_class = "console.api.agent_auth.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "`Bearer <agent token>`, the job's token (`manage.py create_job`).",
        }


class AgentRateThrottle(BaseThrottle):
    """Per-job request rate (``agent_rate``: BRAKELINE_AGENT_RATE, default 6000/min, or
    BRAKELINE_AGENT_RATE_PER_RANK times the job's ranks when more), answered with 429.

    A fixed-window counter: one Redis INCR per request on a process-wide connection pool.
    DRF's SimpleRateThrottle keeps a list of every request time in the cache (6,000 entries
    at the default rate, read and rewritten per request) and Django's cache opens a new Redis
    connection per request under ASGI; both cost more than the batch they guard.
    """

    def allow_request(self, request, view) -> bool:
        principal = request.user
        if not isinstance(principal, AgentPrincipal):
            return True
        self.wait_seconds = agent_wait_seconds(principal.job)
        return self.wait_seconds == 0

    def wait(self) -> float | None:
        return self.wait_seconds or None
