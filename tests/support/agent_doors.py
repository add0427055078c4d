"""The agent endpoints' two front doors as tests use them.

``lean``: the ASGI stack Daphne serves the hot path with (console.agent_gate, then
console.agent_lean), driven in this process: its synchronous work runs in the test's thread, on
the test's database connection (asgiref runs thread-sensitive code in the calling sync thread).
``drf``: Django's test client, through the middleware and the DRF views (also what serves the
paths the lean route does not take). A module sets ``BOTH_AGENT_DOORS = True`` to run each of
its tests through both (tests/conftest.py); others take the lean door, as production does.
"""

from __future__ import annotations

import json
from unittest import mock

from asgiref.sync import async_to_sync
from django.http import HttpResponse

from console.agent_lean import agent_http_stack


async def _not_django(scope: dict, receive, send) -> None:
    raise AssertionError(f"{scope['path']} left the lean route for Django")


def lean_post(
    path: str, body: bytes, headers: dict[str, str], django_app=_not_django
) -> HttpResponse:
    """POST through the gate and the lean route (then ``django_app`` for the paths it does not
    take); the answer as a test client's response."""
    received: list[bool] = []
    sent: list[dict] = []

    async def receive() -> dict:
        if received:
            return {"type": "http.disconnect"}
        received.append(True)
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    raw_headers = [(b"content-length", str(len(body)).encode())]
    raw_headers += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    scope = {"type": "http", "method": "POST", "path": path, "headers": raw_headers}
    # Outside a test, the route gives its connection back before and after a request; here the
    # connection is the test's, inside its transaction (as Django's test client leaves it).
    with mock.patch("console.agent_gate.close_old_connections"):
        stack = agent_http_stack(django_app, thread_sensitive=True)
        async_to_sync(stack)(scope, receive, send)
    start, body_message = sent
    response = HttpResponse(body_message["body"], status=start["status"])
    for name, value in start["headers"]:
        response[name.decode("latin-1")] = value.decode("latin-1")
    response.json = lambda: json.loads(response.content)  # type: ignore[attr-defined]
    return response
