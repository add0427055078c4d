"""The ASGI gate in front of the agent endpoints: authenticate first, then read, bounded.

Django's ASGI handler reads a request's whole body (spooling it to disk when large) before any
view or middleware runs, so without this gate anybody could make the console read, and store
for a while, a body of any size without a token. For ``POST /api/v1/agent/…`` this gate:

1. authenticates the bearer token from the headers alone (401 otherwise, body unread);
2. refuses a declared ``Content-Length`` above ``AGENT_MAX_BATCH_BYTES`` (413, body unread);
3. reads the body itself, stopping one byte past the limit (413: a chunked body that lies);
4. hands the body it read on: to the lean route of the hot path (console/agent_lean.py), or
   to Django, so the views see the request unchanged;
5. counts the request as held by this process until it is answered (both doors pass here),
   so the web tier's beacon can say how far behind its agents it has heard
   (breakers.control.backlog, breakers.control.hearing).

Its refusals are counted in the request log's agent traffic summary. The views check the same
limits; this only decides whether the body is read at all. DRF's
authentication takes the job this gate authenticated (scope[GATE_AUTHENTICATED]) rather than
looking the same token up twice. Answers use the API's error format (docs/protocol.md "Errors").
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from breakers.control.backlog import AGENT_REQUESTS, Held
from console.api.agent_auth import GATE_AUTHENTICATED, required_bearer_token
from console.api.agent_endpoints import AGENT_PREFIX, TOO_LARGE
from console.api.errors import database_recently_away, outage_body, outage_part
from console.api.params import length_exceeds
from console.request_log import agent_traffic
from core.errors import PayloadTooLarge, ServiceError
from incidents.agent_tokens import authenticate_agent
from incidents.models import Job


def header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value
    return None


async def send_json(
    send: Any, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """One whole JSON answer over ASGI."""
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": [*start, *headers]})
    await send({"type": "http.response.body", "body": body})


async def _answer(send: Any, error: ServiceError) -> None:
    agent_traffic().record(error.status)  # the request log's summary counts the gate's refusals
    headers = [(b"www-authenticate", b'Bearer realm="brakeline"')] if error.status == 401 else []
    await send_json(send, error.status, json.dumps(error.as_body()).encode(), headers)


async def _unavailable(send: Any, part: str) -> None:
    agent_traffic().record(503)
    await send_json(send, 503, json.dumps(outage_body(part)).encode(), [(b"retry-after", b"1")])


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(TOO_LARGE.format(limit=limit), fields={"body": f"at most {limit} bytes"})


async def _authenticate(scope: dict) -> None:
    token = required_bearer_token(header(scope, b"authorization"))
    job = await sync_to_async(_check_token, thread_sensitive=True)(token)
    # The view's authentication takes the job from here instead of asking PostgreSQL again:
    # same request, same token, milliseconds later (it was a quarter of the web process's CPU
    # per metrics batch to look the token up twice).
    scope[GATE_AUTHENTICATED] = (token, job)


def _check_token(token: str) -> Job:
    """The token's job, if it exists and the token is not revoked (Unauthenticated otherwise)."""
    with own_connections():
        return authenticate_agent(token)


@contextmanager
def own_connections() -> Iterator[None]:
    """Database work outside Django's request cycle: its connections are closed (given back to
    the pool) before and after, the way that cycle's signals would."""
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()


async def _read_bounded(receive: Any, limit: int) -> bytes | None:
    """The body, or None once it grows past ``limit`` (the rest is never read)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class AgentRequestGate:
    """ASGI middleware: see the module's docstring."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not (
            scope["type"] == "http"
            and scope.get("method") == "POST"
            and scope.get("path", "").startswith(AGENT_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        # Held from its arrival to its answer, but for the time its client takes to send the
        # body: the beacon reports what this process holds unserved (breakers.control.backlog).
        held = AGENT_REQUESTS.hold()
        try:
            await self._gate(scope, receive, send, held)
        finally:
            held.release()

    async def _gate(self, scope: dict, receive: Any, send: Any, held: Held) -> None:
        limit = settings.AGENT_MAX_BATCH_BYTES
        if database_recently_away():
            await _unavailable(send, "database")  # at once: the pool would only wait
            return
        try:
            await _authenticate(scope)
            declared = (header(scope, b"content-length") or b"0").decode("latin-1")
            if length_exceeds(declared, limit):  # "²" or 5,000 digits: no int() error
                raise _too_large(limit)
            held.pause()
            body = await _read_bounded(receive, limit)
            held.resume()
            if body is None:
                raise _too_large(limit)
        except ServiceError as error:
            await _answer(send, error)
            return
        except Exception as error:
            # The token lookup met a database (or Redis) outage: outside Django's request
            # cycle nothing turns that into an answer, and Daphne would send its own 500,
            # which an agent stops retrying after five. A 503 it retries until we are back.
            part = outage_part(error)
            if part is None:
                raise
            await _unavailable(send, part)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # only the disconnect is left

        await self.app(scope, replay, send)
