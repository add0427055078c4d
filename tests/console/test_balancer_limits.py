"""The compose stack's balancer (deploy/haproxy.cfg) refuses oversized bodies before any web
replica reads them: Daphne buffers a whole body before the console's gate sees the request, so
the byte limit has to be in front of it. A real HAProxy with the deployed configuration, in
front of a real HTTP server on 127.0.0.1 standing in for a replica that records what it got."""

from __future__ import annotations

import http.client
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = pytest.mark.skipif(
    not Path(HAPROXY).exists(), reason="HAProxy is not installed (.ci/run installs it)"
)


class Replica(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, int]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(0)

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        self._answer(len(self.rfile.read(length)))

    def _answer(self, received: int) -> None:
        Replica.seen.append((self.command, self.path, received))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _config(front: int, back: int) -> str:
    """The deployed file with local ports in place of Docker's DNS and the published port."""
    text = (ROOT / "deploy" / "haproxy.cfg").read_text()
    head, rest = text.split("\nresolvers docker\n", 1)
    rest = rest[rest.index("\nfrontend console\n") :]
    rest = rest.replace("    bind :8000", f"    bind 127.0.0.1:{front}")
    lines = [line for line in rest.splitlines() if "server-template" not in line]
    return head + "\n".join(lines) + f"\n    server replica 127.0.0.1:{back}\n"


@pytest.fixture
def balancer(tmp_path):
    Replica.seen = []
    replica = ThreadingHTTPServer(("127.0.0.1", 0), Replica)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    front = _free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(_config(front, replica.server_address[1]))
    process = subprocess.Popen([HAPROXY, "-f", str(config), "-db"], stderr=subprocess.PIPE)
    try:
        for _ in range(200):  # until it listens: an event, not a fixed sleep
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", front)) == 0:
                    break
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            time.sleep(0.05)
        yield front
    finally:
        process.terminate()
        process.wait(timeout=10)
        replica.shutdown()


def _posts(seen: list[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    return [entry for entry in seen if entry[0] == "POST"]


def test_a_declared_body_above_the_limit_never_reaches_a_replica(balancer):
    # Without the limit the replica would wait for the gigabyte: the timeout fails the test.
    with socket.create_connection(("127.0.0.1", balancer), timeout=10) as connection:
        connection.sendall(
            b"POST /api/v1/agent/metrics HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n" + b"x" * 65_536
        )
        answer = connection.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    assert _posts(Replica.seen) == []


def test_a_body_of_unknown_length_is_refused(balancer):
    with socket.create_connection(("127.0.0.1", balancer), timeout=10) as connection:
        connection.sendall(
            b"POST /api/v1/agent/metrics HTTP/1.1\r\nHost: localhost\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n10000\r\n" + b"x" * 65_536 + b"\r\n"
        )
        answer = connection.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    assert _posts(Replica.seen) == []


def test_the_largest_batch_the_console_takes_passes(balancer):
    body = b"x" * (4 * 1024 * 1024)  # BRAKELINE_MAX_BATCH_BYTES' default
    connection = http.client.HTTPConnection("127.0.0.1", balancer, timeout=30)
    connection.request("POST", "/api/v1/agent/metrics", body, {"Host": "localhost"})
    response = connection.getresponse()
    assert response.status == 200 and response.read() == b"ok"
    assert _posts(Replica.seen) == [("POST", "/api/v1/agent/metrics", len(body))]
