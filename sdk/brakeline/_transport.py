"""The one place that speaks HTTP to the console.

Everything above this module talks to a :class:`Transport` (``post(path, body)``), so tests can
swap in an in-process recorder and integration tests can point a real run at a real console.
Only the standard library is used; every call has a timeout.
"""

from __future__ import annotations

import dataclasses
import email.utils
import ipaddress
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Protocol

from brakeline._version import __version__

AGENT_PREFIX = "/api/v1/agent"


class TransportError(Exception):
    """The console could not be reached (connection refused, timeout, DNS, TLS...)."""


@dataclasses.dataclass
class Response:
    """An HTTP answer: status, decoded JSON body (or {}), and Retry-After in seconds if given."""

    status: int
    body: dict[str, Any]
    retry_after: float | None = None
    # The console's protocol version (its Brakeline-Protocol header; 0 when it sent none).
    protocol: int = 0

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def commands(self) -> list[dict[str, Any]]:
        """Commands piggy-backed on a heartbeat or metrics reply (absent or malformed -> [])."""
        commands = self.body.get("commands") if isinstance(self.body, dict) else None
        return [c for c in commands if isinstance(c, dict)] if isinstance(commands, list) else []


class Transport(Protocol):
    """What the background threads need from the network."""

    def post(self, path: str, body: bytes) -> Response:
        """POST a JSON body to ``/api/v1/agent/<path>``; raise TransportError if unreachable."""
        ...


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date); None if absent."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if moment is None:
        return None
    now = time.time() if now is None else now
    return max(0.0, moment.timestamp() - now)


class HttpTransport:
    """urllib-based transport. Stateless apart from its settings, so threads may share one."""

    def __init__(self, url: str, token: str, timeout: float = 10.0) -> None:
        self.base_url = url.rstrip("/") + AGENT_PREFIX
        self.timeout = timeout
        # A console on this machine is never reached through an HTTP proxy from the environment.
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(url) else []
        self._opener = urllib.request.build_opener(*handlers)
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"brakeline-python/{__version__}",
        }

    def post(self, path: str, body: bytes) -> Response:
        try:
            request = urllib.request.Request(
                f"{self.base_url}/{path.lstrip('/')}",
                data=body,
                headers=self._headers,
                method="POST",
            )
            with self._opener.open(request, timeout=self.timeout) as answer:
                return _response(
                    answer.status,
                    answer.read(),
                    answer.headers.get("Retry-After"),
                    answer.headers.get("Brakeline-Protocol"),
                )
        except urllib.error.HTTPError as error:
            # 4xx/5xx arrive as exceptions in urllib; they are answers, not transport failures.
            with error:
                payload = error.read()
            return _response(
                error.code,
                payload,
                error.headers.get("Retry-After"),
                error.headers.get("Brakeline-Protocol"),
            )
        except (OSError, ValueError) as error:
            # URLError, timeouts, resets and malformed URLs all mean "not reachable now".
            raise TransportError(f"{type(error).__name__}: {error}") from error


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _response(
    status: int, payload: bytes, retry_after: str | None, protocol: str | None = None
) -> Response:
    try:
        body = json.loads(payload.decode("utf-8")) if payload else {}
    except (UnicodeDecodeError, ValueError):
        body = {"error": "not_json", "detail": payload[:200].decode("utf-8", "replace")}
    if not isinstance(body, dict):
        body = {"value": body}
    version = int(protocol) if protocol and protocol.strip().isdigit() else 0
    return Response(
        status=status, body=body, retry_after=parse_retry_after(retry_after), protocol=version
    )


def encode_json(value: Any) -> bytes:
    """Strict JSON (no bare NaN): callers convert non-finite floats to strings first."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")
