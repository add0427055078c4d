"""The lean route of the agent hot path: metrics batches, heartbeats and acks without Django's
request cycle.

Every rank of every job sends about one request a second, so a request's fixed cost is paid
thousands of times a second. Behind ``console.agent_gate`` (the token authenticated, the body
bounded and read), a POST whose path is in ``console.api.agent_endpoints`` goes no further into
Django: no URL resolver, no middleware chain (sessions, CSRF, people's authentication,
messages, CSP, sign-in lockouts) and no DRF (content negotiation, parsers, authentication and
throttle classes, renderer lookup). None of it serves an agent. What it keeps, through the same
functions the DRF views use:

- the job the gate authenticated with the agents' token service (hashed, revoked refused);
- the job's rate limit (``console.ratelimit.agent_wait_seconds``), 429 with Retry-After;
- the Content-Type and byte limit checks, then the endpoint's handler: one protocol parser;
- the API's error format, 503 with Retry-After for an outage (nothing was written);
- the ``Brakeline-Protocol`` header, and the request log's agent traffic summary;
- Django's database connection hygiene around the request (``own_connections``).

Any other path (snapshots, checkpoints, an unknown one) goes on to Django as before.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from rest_framework.renderers import JSONRenderer

from breakers.agent.protocol import PROTOCOL_VERSION
from console.agent_gate import AgentRequestGate, header, own_connections, send_json
from console.api.agent_auth import GATE_AUTHENTICATED
from console.api.agent_endpoints import (
    TOO_LARGE,
    RateLimited,
    Route,
    body_is_typed,
    check_content_type,
    resolve,
)
from console.api.errors import outage_body, outage_part
from console.ratelimit import agent_wait_seconds
from console.request_log import agent_traffic
from core.errors import PayloadTooLarge, ServiceError
from incidents.models import Job

# Django's own logger for a request that failed: what operators already watch for 500s.
log = logging.getLogger("django.request")
# DRF's renderer itself (no negotiation): the same bytes as the DRF views' answers.
_renderer = JSONRenderer()
_PROTOCOL_HEADER = (b"brakeline-protocol", str(PROTOCOL_VERSION).encode())


@dataclass(frozen=True)
class AgentRequest:
    job: Job
    route: Route
    content_type: str
    declared_length: str
    body: bytes
    path: str = ""


@dataclass(frozen=True)
class AgentAnswer:
    status: int
    data: dict[str, Any]
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    @property
    def body(self) -> bytes:
        return _renderer.render(self.data)

    @property
    def points(self) -> int:
        """The points a metrics batch stored, for the traffic summary."""
        accepted = self.data.get("accepted")
        return accepted if isinstance(accepted, int) else 0


def answer_agent(request: AgentRequest) -> AgentAnswer:
    """Serve one authenticated agent request of the lean route (synchronous: the services are)."""
    with own_connections():
        answer = _answer(request)
    agent_traffic().record(answer.status, answer.points)
    answer.headers.append(_PROTOCOL_HEADER)
    return answer


def _answer(request: AgentRequest) -> AgentAnswer:
    try:
        status, data = _serve(request)
    except ServiceError as error:
        headers = []
        if isinstance(error, RateLimited):
            headers.append((b"retry-after", str(error.wait_seconds).encode()))
        return AgentAnswer(error.status, error.as_body(), headers)
    except Exception as error:
        part = outage_part(error)
        if part is not None:
            return AgentAnswer(503, outage_body(part), [(b"retry-after", b"1")])
        log.error("Internal Server Error: %s", request.path, exc_info=True)
        body = {"error": "server_error", "detail": "The console failed; retry.", "fields": {}}
        return AgentAnswer(500, body)
    return AgentAnswer(status, data)


def _serve(request: AgentRequest) -> tuple[int, dict[str, Any]]:
    """The DRF views' order: the rate limit, the Content-Type, the size, the endpoint."""
    wait = agent_wait_seconds(request.job)
    if wait:
        raise RateLimited(math.ceil(wait))
    if body_is_typed(request.declared_length, request.content_type):
        check_content_type(request.content_type)
    limit = settings.AGENT_MAX_BATCH_BYTES
    if len(request.body) > limit:  # the gate has stopped reading there already
        raise PayloadTooLarge(
            TOO_LARGE.format(limit=limit), fields={"body": f"at most {limit} bytes"}
        )
    route = request.route
    return route.handler(request.job, request.body, route.id)


async def _whole_body(receive: Any) -> bytes:
    """The body the gate has read (one message), or the rest of a longer one."""
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(chunks)


def _text(scope: dict, name: bytes) -> str:
    return (header(scope, name) or b"").decode("latin-1")


class LeanAgentRoutes:
    """ASGI: the lean route for gate-authenticated agent POSTs of ``agent_endpoints``; every
    other request goes on to ``app`` (Django)."""

    def __init__(self, app: Any, *, thread_sensitive: bool = False) -> None:
        self.app = app
        self.thread_sensitive = thread_sensitive

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        gated = scope.get(GATE_AUTHENTICATED) if scope["type"] == "http" else None
        route = resolve(scope.get("path", "")) if gated is not None else None
        if gated is None or route is None:
            await self.app(scope, receive, send)
            return
        request = AgentRequest(
            job=gated[1],
            route=route,
            content_type=_text(scope, b"content-type"),
            declared_length=_text(scope, b"content-length"),
            body=await _whole_body(receive),
            path=scope["path"],
        )
        # In the event loop's thread pool: requests wait on PostgreSQL side by side, each
        # thread on its own connection, lent by the pool for one request (own_connections);
        # no thread is started per request, as Django's handler does.
        serve = sync_to_async(answer_agent, thread_sensitive=self.thread_sensitive)
        answer = await serve(request)
        await send_json(send, answer.status, answer.body, answer.headers)


def agent_http_stack(django_app: Any, *, thread_sensitive: bool = False) -> AgentRequestGate:
    """The console's HTTP application: the agent gate, then the lean route (unless
    ``BRAKELINE_AGENT_LEAN=0``), then ``django_app`` for everything else. ``thread_sensitive``:
    the lean route's work runs in the calling sync thread when there is one (a test's, with
    its database transaction), as the gate's token lookup does."""
    if not settings.AGENT_LEAN:
        return AgentRequestGate(django_app)
    return AgentRequestGate(LeanAgentRoutes(django_app, thread_sensitive=thread_sensitive))
