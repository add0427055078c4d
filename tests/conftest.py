"""Fixtures shared by the whole suite: real PostgreSQL, real Redis, real Daphne.

The suite refuses to run on the embedded SQLite default: `make test` points it at the
services. The few tests of the embedded mode run it in a subprocess of their own.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from bench._stack import daphne_command

ROOT = Path(__file__).resolve().parent.parent

# Fixtures that modules of several folders use (tests/support/): a test names them as
# parameters, and imports only the helpers.
pytest_plugins = [
    "tests.support.authz",
    "tests.support.drills",
    "tests.support.haproxy",
    "tests.support.notify",
    "tests.support.review",
    "tests.support.worker",
]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """With BRAKELINE_NO_SKIPS=1 (CI: .ci/run sets it) a skipped test fails: a real-component
    suite (Slurm, Prometheus, HAProxy, Chromium, Patroni…) whose binary is missing must not
    pass for green there."""
    outcome = yield
    report = outcome.get_result()
    strict = os.environ.get("BRAKELINE_NO_SKIPS") == "1"
    if strict and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped where nothing may be (BRAKELINE_NO_SKIPS=1): {reason}"


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.has_plugin("django"):
        return  # pure tests run with -p no:django need no database at all
    from django.conf import settings

    if settings.EMBEDDED or settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        pytest.exit(
            "The test suite runs against PostgreSQL and Redis, not the embedded SQLite: run "
            "`make test`, or set DATABASE_URL=postgresql://postgres@127.0.0.1:5432/brakeline "
            "and REDIS_URL=redis://127.0.0.1:6379/10.",
            returncode=2,
        )
    # The watchdog judges silences up to the web tier's beacon (breakers.control.hearing),
    # which web processes write on the real clock; the in-process watchdog of these tests
    # runs on clocks the tests move. Its own tests turn it back on (tests/breakers/
    # test_console_hearing.py); subprocess stacks keep the production setting.
    settings.JUDGE_SILENCE_BY_BEACON = False
    # The suite's process started long ago as far as health is concerned: a stale beat is
    # "degraded" at once (tests/console/test_health.py turns "starting" back on).
    settings.HEALTH_STARTING_SECONDS = 0.0
    # The suite's jobs write checkpoints in temporary folders: the operator's default root is
    # "/" here (and in the consoles and workers it starts), unless a test declares its own.
    os.environ.setdefault("BRAKELINE_CHECKPOINT_ROOT", "/")
    settings.CHECKPOINT_ROOT = settings.CHECKPOINT_ROOT or "/"
    # The flush after each transactional test empties only what holds rows (tests/support/
    # flush.py).
    from tests.support.flush import install

    install()
    # Users the tests create hash their passwords cheaply (tests/support/hashers.py).
    settings.PASSWORD_HASHERS = ["tests.support.hashers.QuickPBKDF2PasswordHasher"]


@dataclass
class Agent:
    """A job with its raw agent token, as a training process would hold them."""

    job_id: int
    token: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@pytest.fixture
def make_agent(db):
    from incidents.jobs import create_job

    counter = iter(range(1, 10_000))

    def make(team: str = "research", name: str | None = None, kind: str = "training") -> Agent:
        created = create_job(team, name or f"job-{next(counter)}", kind)
        return Agent(job_id=created.job.pk, token=created.raw_token)

    return make


@pytest.fixture
def agent(make_agent) -> Agent:
    return make_agent()


@pytest.fixture(autouse=True)
def _no_database_outage_from_before(request: pytest.FixtureRequest) -> None:
    """An outage an earlier test simulated is not this one's: for a second after it, the agent
    gate answers 503 without asking the database (console.api.errors.database_recently_away)."""
    if request.config.pluginmanager.has_plugin("django"):
        from console.api import errors

        errors._database_failed_at[0] = -math.inf


@pytest.fixture
def agent_door() -> str:
    """How agent_post reaches the console: "lean" (the ASGI route Daphne serves agents with) or
    "drf" (the test client and the DRF views): tests/support/agent_doors.py."""
    return "lean"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "agent_door" in metafunc.fixturenames and getattr(metafunc.module, "BOTH_AGENT_DOORS", 0):
        metafunc.parametrize("agent_door", ["lean", "drf"])


@pytest.fixture
def agent_post(client, agent, agent_door):
    """POST a body (dict → JSON, or raw bytes/str) to an agent endpoint with the token."""
    from console.api.agent_endpoints import resolve
    from tests.support.agent_doors import lean_post

    def post(path: str, body, *, token: str | None = None, content_type="application/json"):
        data = body if isinstance(body, bytes | str) else json.dumps(body)
        headers = {"Authorization": f"Bearer {token or agent.token}"} if token != "" else {}
        if agent_door == "lean" and resolve(path) is not None:
            typed = {"Content-Type": content_type} if content_type else {}
            raw = data.encode() if isinstance(data, str) else data
            return lean_post(path, raw, headers | typed)
        return client.post(path, data=data, content_type=content_type, headers=headers)

    return post


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def server_environment(**extra: str) -> dict[str, str]:
    """The environment of a child process that must use the *test* database."""
    from django.db import connection

    settings_dict = connection.settings_dict
    user = settings_dict["USER"] or "postgres"
    host = settings_dict["HOST"] or "127.0.0.1"
    port = settings_dict["PORT"] or 5432
    env = dict(os.environ)
    env["DATABASE_URL"] = f"postgresql://{user}@{host}:{port}/{settings_dict['NAME']}"
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def live_console(django_db_setup, django_db_blocker):
    """Daphne serving config.asgi on a free port against the test database.

    pytest-django's live_server is WSGI (no websockets) and Channels' live server test case
    forks badly here, so a plain subprocess it is (docs/testing.md "A live ASGI server").
    """
    port = free_port()
    with django_db_blocker.unblock():
        # Teams' own drill commands on: the drills page's workload form is in the browser tests.
        # The stand-in SMS/phone provider's reply secret (tests.support.notify.REPLY_SECRET).
        env = server_environment(
            BRAKELINE_DRILL_TEAM_COMMANDS="true",
            BRAKELINE_NOTIFY_REPLY_SECRET="stand-in-provider-reply-secret",
        )
    process = subprocess.Popen(
        daphne_command(port),
        cwd=ROOT,
        env=env,
    )
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture(scope="session")
def celery_worker(django_db_setup):
    """A real Celery worker (solo pool, in a thread of this process) on the test queue in Redis.

    It reaches the database only while a test holds it open: tests that use it need
    ``@pytest.mark.django_db(transaction=True)`` (the worker's connection cannot see rows of a
    test transaction that never commits) and must wait until it is idle before they end.
    Tasks and coalescing flags left by an earlier run are purged first: they name jobs of
    another test database.
    """
    import redis
    from celery.contrib.testing.worker import start_worker
    from django.conf import settings

    from config.celery import app

    app.control.purge()
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(f"{settings.CHANNEL_PREFIX}:breakers:*"):
        client.delete(key)
    client.close()
    global _worker_started
    _worker_started = True
    # In a thread of the test process the worker must let go of its connections after every
    # task, as Celery's Django fixup does by default: tests flush the database between them.
    # (Worker processes keep theirs: CELERY_DB_REUSE_MAX, test_worker_connections.py.)
    app.conf.CELERY_DB_REUSE_MAX = None
    # Celery's Django fixup reads that setting once, when its worker fixup is first built: an
    # earlier test that called app.loader.import_default_modules() built it with the production
    # value (500), and this worker then kept its connections across tests — a later
    # create_job failed with "another command is already in progress" or hung. Forget such an
    # early fixup so the worker builds its own now, with None.
    for fixup in app._fixups or ():
        if hasattr(fixup, "_worker_fixup"):
            fixup._worker_fixup = None
    with start_worker(
        app,
        pool="solo",
        perform_ping_check=False,
        queues=settings.WORKER_QUEUES,
        shutdown_timeout=30,
    ) as worker:
        yield worker


_worker_started = False


def _worker_is_idle() -> bool:
    import redis
    from celery.worker import state as worker_state
    from django.conf import settings

    if worker_state.active_requests or worker_state.reserved_requests:
        return False
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return all(client.llen(queue) == 0 for queue in settings.WORKER_QUEUES)
    finally:
        client.close()


@pytest.fixture(autouse=True)
def _drain_the_worker_before_the_flush(request):
    """Once the session's Celery worker runs, any transactional test may feed it (ingest
    schedules evaluations); its tasks must finish before the test's tables are flushed, or the
    flush deadlocks with them and the next test finds this one's rows."""
    marker = request.node.get_closest_marker("django_db")
    transactional = marker is not None and (
        marker.kwargs.get("transaction") or (marker.args and marker.args[0])
    )
    if transactional:
        request.getfixturevalue("transactional_db")  # set up first, so torn down after us
    yield
    if transactional and _worker_started:
        deadline = time.monotonic() + 30
        while not (_worker_is_idle() and (time.sleep(0.05) or _worker_is_idle())):
            if time.monotonic() > deadline:
                raise AssertionError("the Celery worker did not go idle within 30 s")
            time.sleep(0.02)
