"""A load balancer's runtime API at the edge of the outside world: a UNIX socket that answers
like HAProxy's stats socket and records every command it received."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

STAT_HEADER = "# pxname,svname,status,scur\n"


@dataclass
class RecordingRuntimeApi:
    address: str
    commands: list[str] = field(default_factory=list)
    received_at: dict[str, float] = field(default_factory=dict)  # a command's last arrival
    stat_rows: list[str] = field(default_factory=list)  # "show stat" lines: "models,r1,UP,0"


@pytest.fixture
def haproxy(tmp_path: Path) -> Iterator[RecordingRuntimeApi]:
    path = tmp_path / "haproxy.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    api = RecordingRuntimeApi(str(path))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                return
            with connection:
                line = connection.recv(4096).decode().strip()
                if not line:
                    continue
                api.received_at[line] = time.time()
                api.commands.append(line)
                if line == "show stat":
                    rows = "".join(f"{row}\n" for row in api.stat_rows)
                    connection.sendall((STAT_HEADER + rows).encode())
                else:
                    connection.sendall(b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield api
    stop.set()
    server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept
    server.close()
    thread.join(5)
