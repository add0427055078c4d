"""HAProxy as a traffic executor, through its runtime API (the stats socket).

``set server <backend>/<server> state drain|maint|ready`` changes a server's admin state at
once, without a reload; ``show stat`` (CSV) says its state and sessions in flight. The socket
is a UNIX socket path (``stats socket /run/haproxy.sock level admin``) or ``host:port`` for a
TCP one (``stats socket ipv4@127.0.0.1:9999 level admin``). One command per connection: the
socket answers and closes, which keeps a half-read answer from leaking into the next command.

Names are checked before they are sent: a backend or server name carrying a space, a
semicolon or a newline would otherwise be a second command on the admin socket.
"""

from __future__ import annotations

import csv
import io
import re
import socket

from breakers.executors.targets import register
from breakers.executors.traffic import ServerState, TrafficError

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
# The runtime API answers a successful "set server" with an empty line; anything else is why.
_TIMEOUT_SECONDS = 5.0
_ADMIN_FROM_STATUS = {"DRAIN": "drain", "MAINT": "maint"}


def _checked(name: str, what: str) -> str:
    if not _NAME.match(name):
        raise TrafficError(f"{what} name {name!r} is not a valid HAProxy name")
    return name


class HAProxyExecutor:
    name = "haproxy"

    def __init__(self, address: str, timeout: float = _TIMEOUT_SECONDS) -> None:
        self.address = address
        self.timeout = timeout

    def _connect(self) -> socket.socket:
        if self.address.startswith("/"):
            connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            target: object = self.address
        else:
            host, _, port = self.address.rpartition(":")
            connection = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            target = (host or "127.0.0.1", int(port))
        connection.settimeout(self.timeout)
        try:
            connection.connect(target)  # type: ignore[arg-type]
        except OSError as error:
            connection.close()
            raise TrafficError(f"HAProxy's runtime API at {self.address}: {error}") from error
        return connection

    def command(self, line: str) -> str:
        """Send one runtime API command; its whole answer."""
        with self._connect() as connection:
            try:
                connection.sendall(line.encode() + b"\n")
                chunks = []
                while chunk := connection.recv(65536):
                    chunks.append(chunk)
            except OSError as error:
                raise TrafficError(f"HAProxy's runtime API: {error}") from error
        return b"".join(chunks).decode(errors="replace")

    def _set_state(self, backend: str, server: str, state: str) -> None:
        target = f"{_checked(backend, 'backend')}/{_checked(server, 'server')}"
        answer = self.command(f"set server {target} state {state}").strip()
        if answer:
            raise TrafficError(f"HAProxy refused 'set server {target} state {state}': {answer}")

    def drain(self, backend: str, server: str) -> None:
        self._set_state(backend, server, "drain")

    def maintenance(self, backend: str, server: str) -> None:
        self._set_state(backend, server, "maint")

    def ready(self, backend: str, server: str) -> None:
        self._set_state(backend, server, "ready")

    def state(self, backend: str, server: str) -> ServerState:
        _checked(backend, "backend")
        _checked(server, "server")
        text = self.command("show stat").lstrip("# ")
        for row in csv.DictReader(io.StringIO(text)):
            if row.get("pxname") == backend and row.get("svname") == server:
                status = row.get("status", "")
                admin = next(
                    (word for key, word in _ADMIN_FROM_STATUS.items() if key in status), "ready"
                )
                return ServerState(backend, server, admin, status, int(row.get("scur") or 0))
        raise TrafficError(f"HAProxy has no server {backend}/{server}")


# Reached only through ``JobTraffic``, which asks the seam first.
register(
    HAProxyExecutor.name,
    __name__,
    acts_on="a backend/server a team admin declared for the job (InferenceServer)",
    check="traffic_server",
)
