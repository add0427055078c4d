"""Browser tests: Playwright driving Debian's Chromium against the real stack (Daphne, a Celery
worker, PostgreSQL, Redis) and a scripted agent speaking plain HTTP.

Playwright's sync API leaves an asyncio loop running on the main thread, so these tests run
after every other test (moved last below) and Django's async-safety check is lifted here only.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

ROOT = Path(__file__).resolve().parents[3]
# Where the tests save what they saw: var/screenshots (untracked) for every run, to look at;
# docs/screenshots, the pictures the docs show, only when asked for on purpose
# (BRAKELINE_UPDATE_SCREENSHOTS=1 make test PYTEST_ARGS=tests/console/browser).
DOC_SCREENSHOTS = ROOT / "docs" / "screenshots"
SCREENSHOTS = (
    DOC_SCREENSHOTS
    if os.environ.get("BRAKELINE_UPDATE_SCREENSHOTS") == "1"
    else Path(os.environ.get("BRAKELINE_SCREENSHOTS_DIR", ROOT / "var" / "screenshots"))
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def pytest_collection_modifyitems(session, config, items):
    """Browser tests last: after them an asyncio loop is left on the main thread."""
    items.sort(key=lambda item: item.get_closest_marker("browser") is not None)


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": "/usr/bin/chromium",
        "args": CHROMIUM_ARGS,
    }


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args):
    return {**browser_context_args, "viewport": {"width": 1400, "height": 1000}}


# Playwright waits 5 s for an expectation by default: too short for a live update on two
# loaded cores. A passing test never waits this long; a failing one says so after it.
EVENT_MS = 45_000


@pytest.fixture(autouse=True)
def _generous_waits(request):
    from playwright.sync_api import expect

    expect.set_options(timeout=EVENT_MS)
    if "page" in request.fixturenames:
        request.getfixturevalue("page").set_default_timeout(EVENT_MS)


@dataclass
class ScriptedAgent:
    """A training process reduced to its protocol: metrics, heartbeats, acknowledgements."""

    base: str
    job_id: int
    token: str
    commands: list[dict] = field(default_factory=list)

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def metrics(self, points: list[tuple[int, float | str]], name: str = "loss") -> dict:
        body = {"points": [{"name": name, "step": s, "value": v} for s, v in points]}
        return self.post("/api/v1/agent/metrics", body)

    def heartbeat(self, step: int, status: str = "running") -> list[dict]:
        return self.post("/api/v1/agent/heartbeat", {"step": step, "status": status})["commands"]

    def wait_for_command(self, kind: str, step: int, timeout: float = 60.0) -> dict:
        """Poll heartbeats (the protocol's fallback channel) until a command of ``kind``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for command in self.heartbeat(step):
                if command["kind"] == kind:
                    return command
            time.sleep(0.1)
        raise AssertionError(f"no {kind} command reached the agent in {timeout} s")

    def ack_checkpoint(self, command: dict, step: int) -> None:
        result = {
            "path": f"/ckpt/step-{step}.pt",
            "bytes": 734_003_200,
            "seconds": 4.2,
            "sha256": "ab" * 32,
            "step": step,
            "released": True,
            "weights_step": step - 1,
        }  # (the step guard skipped the NaN update)
        self.post(
            f"/api/v1/agent/commands/{command['id']}/ack", {"status": "succeeded", "result": result}
        )


@pytest.fixture
def scripted_agent(live_console, make_agent):
    def make(team: str = "vision", name: str = "llm-70b") -> ScriptedAgent:
        agent = make_agent(team=team, name=name)
        return ScriptedAgent(live_console, agent.job_id, agent.token)

    return make


@pytest.fixture
def people(db):
    from django.contrib.auth import get_user_model

    from incidents.models import Membership, Team

    def make(username: str, team: str, role: str):
        user = get_user_model().objects.create_user(username, password="pw-for-tests")
        Membership.objects.create(
            user=user, team=Team.objects.get_or_create(name=team)[0], role=role
        )
        return user

    return make


@pytest.fixture
def log_in(live_console):
    def go(page, username: str) -> None:
        page.goto(f"{live_console}/login/")
        page.fill("input[name=username]", username)
        page.fill("input[name=password]", "pw-for-tests")
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_console}/")

    return go


@pytest.fixture
def beat(celery_worker):
    """A real Celery beat (the watchdog every second) on the test database, so the health
    banner is quiet in screenshots. Tests without it see the banner (the beat is stale)."""
    from tests.support.beat import running_beat

    with running_beat() as process:
        yield process


def keep_posting(agent: ScriptedAgent, start: int, stop: threading.Event) -> threading.Thread:
    """Background training: a healthy, slowly decaying loss and a heartbeat every batch."""

    def run() -> None:
        step = start
        while not stop.is_set():
            agent.metrics(
                [(s, 2.0 + 1.0 / (1 + s / 200) + (s % 5) * 0.004) for s in range(step, step + 10)]
            )
            agent.heartbeat(step + 9)
            step += 10
            time.sleep(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
