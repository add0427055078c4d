"""Length-prefixed frames on the node's local socket (``brakeline._node``, ``_forwarder``).

A request is two frames, a JSON header (``{"op": "post", "path", "rank", "urgent"}`` or
``{"op": "subscribe", "rank"}``) and the body the rank would have posted; an answer is a
header (``{"status", "retry_after", "protocol"}``, status 0: the console was not reached)
and the console's answer's JSON. A subscriber receives one frame per command.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

FRAME = struct.Struct("!I")
# A metrics batch is at most batch_bytes (1 MiB by default); a frame past this is a bug.
MAX_FRAME = 64 * 1024 * 1024


class FrameError(OSError):
    """The other end closed the socket mid-frame, or sent something that is not a frame."""


def send_frames(connection: socket.socket, *payloads: bytes) -> None:
    connection.sendall(b"".join(FRAME.pack(len(payload)) + payload for payload in payloads))


def receive_frame(connection: socket.socket) -> bytes:
    (size,) = FRAME.unpack(_receive_exactly(connection, FRAME.size))
    if size > MAX_FRAME:
        raise FrameError(f"a frame of {size} bytes on the node socket")
    return _receive_exactly(connection, size)


def receive_header(connection: socket.socket) -> dict[str, Any]:
    try:
        header = json.loads(receive_frame(connection))
    except ValueError as error:
        raise FrameError(f"a header that is not JSON: {error}") from error
    if not isinstance(header, dict):
        raise FrameError("a header that is not an object")
    return header


def header(**fields: Any) -> bytes:
    return json.dumps(fields, separators=(",", ":")).encode("utf-8")


def _receive_exactly(connection: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = connection.recv(min(left, 1 << 20))
        if not chunk:
            raise FrameError("the node socket closed mid-frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
