"""Real local servers for the notification tests: an HTTP receiver and an SMTP server.

Both listen on 127.0.0.1 (free ports), run in threads of the test process and are stopped by
their fixtures (``receiver``, ``smtp_server``: plugins, named as parameters); nothing of our own
infrastructure is mocked.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

# The secret the stand-in provider and the console under test share (tests/conftest.py gives
# it to the live console too).
REPLY_SECRET = "stand-in-provider-reply-secret"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)

    @property
    def form(self) -> dict[str, str]:
        return dict(urllib.parse.parse_qsl(self.body.decode()))


@dataclass
class Receiver:
    """Answers POSTs; ``plans[path]`` lists the statuses to answer in turn (then 2xx)."""

    url: str = ""
    requests: list[Received] = field(default_factory=list)
    plans: dict[str, list[int]] = field(default_factory=dict)
    on_request: Callable[[Received], None] | None = None

    def to(self, path_end: str) -> list[Received]:
        return [r for r in self.requests if r.path.endswith(path_end)]

    def answer(
        self, url: str, form: dict[str, str], secret: str = REPLY_SECRET, **signed: str
    ) -> tuple[int, dict]:
        """The provider posting a person's answer (an SMS reply, a keypress) to the console,
        signed as the console expects; ``signed`` overrides the timestamp or signature."""
        return post_signed(url, urllib.parse.urlencode(form).encode(), secret, **signed)


def post_signed(
    url: str, body: bytes, secret: str, *, timestamp: str = "", signature: str = ""
) -> tuple[int, dict]:
    from incidents.notifications.reply_codes import (
        SIGNATURE_HEADER,
        TIMESTAMP_HEADER,
        reply_signature,
    )

    parts = urllib.parse.urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    timestamp = timestamp or str(int(time.time()))
    signature = signature or reply_signature(secret, timestamp, path, body)
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        TIMESTAMP_HEADER: timestamp,
        SIGNATURE_HEADER: signature,
    }
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length") or 0)
            received = Received(self.path, dict(self.headers), self.rfile.read(length))
            receiver.requests.append(received)
            if receiver.on_request is not None:
                receiver.on_request(received)
            plan = receiver.plans.get(self.path.rsplit("/", 1)[-1], [])
            status = plan.pop(0) if plan else (201 if self.path.endswith(".json") else 200)
            body = b'{"sid": "SM123", "status": "queued"}' if status < 300 else b"try later"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def sms_provider(receiver: Receiver, settings) -> Receiver:
    """The SMS/voice provider's API pointed at ``receiver`` (a real HTTP server on 127.0.0.1)."""
    settings.NOTIFY_PROVIDER_BASE_URL = receiver.url + "/2010-04-01/Accounts/AC1"
    settings.NOTIFY_PROVIDER_ACCOUNT_SID = "AC1"
    settings.NOTIFY_PROVIDER_AUTH_TOKEN = "secret"
    settings.NOTIFY_PROVIDER_FROM_NUMBER = "+15550000000"
    settings.NOTIFY_REPLY_SECRET = REPLY_SECRET
    return receiver


@dataclass
class Mailbox:
    host: str
    port: int
    messages: list[tuple[list[str], bytes]] = field(default_factory=list)

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's naming)
        self.messages.append((list(envelope.rcpt_tos), envelope.original_content))
        return "250 OK"


@pytest.fixture
def smtp_server() -> Iterator[Mailbox]:
    from aiosmtpd.controller import Controller

    from tests.conftest import free_port

    mailbox = Mailbox("127.0.0.1", free_port())
    controller = Controller(mailbox, hostname=mailbox.host, port=mailbox.port)
    controller.start()
    try:
        yield mailbox
    finally:
        controller.stop()
