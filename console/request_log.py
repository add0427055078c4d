"""The request log: people's requests one line each, agent traffic summed up once a minute.

Training agents POST metrics and heartbeats many times a second; a line per request would bury
the lines that matter (a warning that an alert pages nobody, a failed delivery). So requests to
``/api/v1/agent/`` are counted, with the points they carried, and logged as one INFO line per
``AGENT_TRAFFIC_LOG_SECONDS`` (60 s) at most, on the next agent request after the window:

    agent traffic: 5210 requests, 52100 points in the last 60 s (refused: 429 ×12)

Daphne's own access log (a line per request on stdout) is turned off where we start Daphne
(``--verbosity 0``); this middleware writes the log instead, through Django's LOGGING.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

AGENT_PREFIX = "/api/v1/agent/"
log = logging.getLogger("brakeline.requests")


class AgentTraffic:
    """Counts agent requests and points; says so in one line per window at most."""

    def __init__(self, window_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.window_seconds = window_seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._reset(clock())

    def _reset(self, now: float) -> None:
        self.started, self.requests, self.points = now, 0, 0
        self.refused: Counter[int] = Counter()

    def record(self, status: int, points: int = 0) -> None:
        with self._lock:
            self.requests += 1
            self.points += points
            if status >= 400:
                self.refused[status] += 1
            now = self.clock()
            if now - self.started < self.window_seconds:
                return
            line = self.summary(now)
            self._reset(now)
        log.info("%s", line)

    def summary(self, now: float) -> str:
        line = (
            f"agent traffic: {self.requests} requests, {self.points} points "
            f"in the last {now - self.started:.0f} s"
        )
        if self.refused:
            codes = ", ".join(f"{code} ×{n}" for code, n in sorted(self.refused.items()))
            line += f" (refused: {codes})"
        return line


_traffic: AgentTraffic | None = None


def agent_traffic() -> AgentTraffic:
    global _traffic
    if _traffic is None:
        _traffic = AgentTraffic(float(settings.AGENT_TRAFFIC_LOG_SECONDS))
    return _traffic


def is_agent_request(path: str) -> bool:
    return path.startswith(AGENT_PREFIX)


def accepted_points(response: HttpResponse) -> int:
    """The points a metrics batch stored (``{"accepted": N}`` in its DRF answer)."""
    data = getattr(response, "data", None)
    accepted = data.get("accepted") if isinstance(data, dict) else None
    return accepted if isinstance(accepted, int) else 0


def note(request: HttpRequest, response: HttpResponse, started: float) -> None:
    status = response.status_code
    if is_agent_request(request.path):
        agent_traffic().record(status, accepted_points(response))
        return
    level = logging.DEBUG if request.path.startswith(settings.STATIC_URL) else logging.INFO
    milliseconds = (time.monotonic() - started) * 1000
    log.log(
        level, "%s %s %s %.0f ms", request.method, request.get_full_path(), status, milliseconds
    )


def request_log_middleware(
    get_response: Callable[[HttpRequest], HttpResponse],
) -> Callable[[HttpRequest], HttpResponse]:
    """Outermost middleware: sees every answer, also those of the middleware below it. Sync
    only, as the whole chain runs (console/sync_chain.py)."""

    def middleware(request: HttpRequest) -> HttpResponse:
        started = time.monotonic()
        response = get_response(request)
        note(request, response, started)
        return response

    return middleware


class NotAgentTraffic(logging.Filter):
    """Drops the per-request lines other loggers write for agent requests that were refused
    (``django.request``'s "Too Many Requests: /api/v1/agent/metrics", the dev server's access
    lines): the summary counts them. Server errors (5xx) stay."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        path = getattr(request, "path", None)
        status = getattr(record, "status_code", None)
        if path is None and isinstance(record.args, dict):  # daphne's runserver: a details dict
            path, status = record.args.get("path"), record.args.get("status")
        if not isinstance(path, str) or not is_agent_request(path):
            return True
        return isinstance(status, int) and status >= 500
