"""Is there a Brakeline console where a drill's sandboxes will report? Asked before a drill.

A drill against a console that does not answer would only wait out its deadlines (300 s of
nothing on the terminal), so ``manage.py drill`` asks the console's public health endpoint
first and stops with one sentence when nothing, or something else, answers there.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

HEALTH_PATH = "/api/v1/health"  # console/api/urls.py: public, 200 healthy or 503 degraded
HEALTH_TIMEOUT_SECONDS = 5.0
# A console answers "starting" until its beat's first tick (BRAKELINE_HEALTH_STARTING_SECONDS,
# 15 s by default): a drill started with it waits rather than stopping.
STARTING_WAIT_SECONDS = 30.0


def console_health(
    url: str, timeout: float = HEALTH_TIMEOUT_SECONDS, starting_wait: float = STARTING_WAIT_SECONDS
) -> tuple[str | None, str | None]:
    """(problem, note) about the console at ``url``, as its health endpoint answers. A problem
    is the sentence to stop on: nothing answers there, or not as a Brakeline console. A note
    says what a console that answers 503 ("degraded": it is there) lacks, which the drill will
    likely fail on. A console still starting (its first seconds, before the beat's first
    tick) is waited for, up to ``starting_wait`` seconds."""
    deadline = time.monotonic() + starting_wait
    while True:
        problem, report = _ask(url, timeout)
        if problem is not None:
            return problem, None
        if report.get("status") != "starting":
            return None, _degraded_note(url, report)
        if time.monotonic() >= deadline:
            return None, f"The console at {url} is still starting: the drill may fail on it."
        time.sleep(0.5)


def _ask(url: str, timeout: float) -> tuple[str | None, dict[str, Any]]:
    """(problem, report) of one question to the health endpoint. Asked directly, without the
    environment's proxies: the sandbox's environment (an allowlist) has none either."""
    target = url.rstrip("/") + HEALTH_PATH
    option = (
        "point the drill at the console its sandboxes should report to with --console-url "
        "(default BRAKELINE_PUBLIC_URL)."
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(target, timeout=timeout) as response:
            body = response.read(65536)
    except urllib.error.HTTPError as error:
        if error.code != 503:
            answer = f"{url} answered {HEALTH_PATH} with HTTP {error.code}"
            return f"{answer}, so it is not a Brakeline console: {option}", {}
        body = error.read(65536)
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        return f"No Brakeline console answers at {url} ({reason}): start it, or {option}", {}
    try:
        report = json.loads(body)
        status = report.get("status")
    except (ValueError, AttributeError):
        report, status = {}, None
    if status not in ("ok", "degraded", "starting"):
        return f"{url} answered {HEALTH_PATH} but not as a Brakeline console does: {option}", {}
    return None, report


def _degraded_note(url: str, report: dict[str, Any]) -> str | None:
    def part(name: str) -> dict[str, Any]:
        value = report.get(name)
        return value if isinstance(value, dict) else {}

    lacking = [
        what
        for what, missing in (
            ("its database does not answer", part("database").get("ok") is False),
            ("Redis does not answer", part("redis").get("ok") is False),
            ("no Celery worker answers (the rules run there)", part("workers").get("count") == 0),
            ("its beat is stale (the watchdog runs there)", part("beat").get("stale") is True),
        )
        if missing
    ]
    if not lacking:
        return None
    return f"The console at {url} answers, but {'; '.join(lacking)}: the drill may fail on it."
