"""``manage.py drill`` as a newcomer meets it: against a console that is not there it stops at
once with one sentence (naming the URL and ``--console-url``) instead of waiting 300 s in
silence; while it drives a scenario it says so; and stopped with SIGTERM it ends its sandboxes
(a session of their own, which no signal to the command reaches) instead of orphaning them.
"""

from __future__ import annotations

import io
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest
from django.core.management import CommandError, call_command

from breakers.drills import runs
from breakers.drills.console_check import console_health
from breakers.models import DrillRun, DrillStatus
from incidents.models import Team
from tests.conftest import ROOT, free_port, server_environment


def nothing_listens() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.mark.django_db
def test_no_console_at_the_url_stops_the_drill_at_once_in_one_sentence():
    Team.objects.create(name="research")
    url = nothing_listens()
    out = io.StringIO()
    started = time.monotonic()
    with pytest.raises(CommandError) as raised:
        call_command(
            "drill",
            "--team",
            "research",
            "--scenario",
            "nan_loss",
            "--scenario",
            "xid",
            "--console-url",
            url,
            stdout=out,
        )
    assert time.monotonic() - started < 10
    sentence = str(raised.value)
    assert sentence.startswith(f"No Brakeline console answers at {url} ")
    assert "--console-url" in sentence and sentence.count(". ") == 0, sentence
    assert not DrillRun.objects.exists()  # nothing queued, nothing started


@pytest.mark.django_db
def test_without_the_option_the_sentence_names_the_public_url(settings):
    Team.objects.create(name="research")
    settings.BRAKELINE_PUBLIC_URL = nothing_listens()
    with pytest.raises(CommandError, match="--console-url") as raised:
        call_command("drill", "--team", "research", "--scenario", "nan_loss", stdout=io.StringIO())
    assert settings.BRAKELINE_PUBLIC_URL in str(raised.value)


@pytest.mark.django_db
def test_something_else_at_the_url_is_not_taken_for_the_console(receiver):
    """An HTTP server that is not a console (here one that answers GET with 501)."""
    Team.objects.create(name="research")
    with pytest.raises(CommandError, match="not a Brakeline console") as raised:
        call_command(
            "drill",
            "--team",
            "research",
            "--scenario",
            "nan_loss",
            "--console-url",
            receiver.url,
            stdout=io.StringIO(),
        )
    assert receiver.url in str(raised.value) and "--console-url" in str(raised.value)


@pytest.mark.django_db
def test_a_queued_set_without_a_console_ends_as_error_saying_why(settings):
    """A set queued from the console (``--drill-set``): its drills' pages show the sentence."""
    team = Team.objects.create(name="research")
    queued = runs.request_drills(team, ["nan_loss", "xid"], launch=False)
    url = nothing_listens()
    with pytest.raises(CommandError, match="No Brakeline console answers"):
        call_command(
            "drill",
            "--drill-set",
            str(queued[0].drill_set),
            "--console-url",
            url,
            stdout=io.StringIO(),
        )
    for run in DrillRun.objects.filter(drill_set=queued[0].drill_set):
        assert run.status == DrillStatus.ERROR and url in run.error


def health_answers(reports: list[dict]) -> tuple[str | None, str | None, int]:
    """console_health against a health endpoint that answers ``reports`` in turn (the last one
    from then on), 503 unless the status is "ok"; and how many times it was asked."""
    asked: list[int] = []

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            report = reports[min(len(asked), len(reports) - 1)]
            asked.append(1)
            body = json.dumps(report).encode()
            ok = report["status"] == "ok"
            self.send_response((200 if ok else 503) if self.path == "/api/v1/health" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        problem, note = console_health(f"http://127.0.0.1:{server.server_address[1]}/")
    finally:
        server.shutdown()
        server.server_close()
    return problem, note, len(asked)


def test_a_degraded_console_is_there_and_the_note_says_what_it_lacks():
    """503 from the health endpoint: the console answers (the drill goes on), with a note."""
    report = {
        "status": "degraded",
        "database": {"ok": True},
        "redis": {"ok": True},
        "beat": {"stale": True},
        "workers": {"count": 0, "stale": True},
    }
    problem, note, _ = health_answers([report])
    assert problem is None
    assert note is not None and "no Celery worker answers" in note and "beat is stale" in note


def test_a_console_still_starting_is_waited_for():
    """A console started a moment ago answers "starting" until its beat's first tick: a drill
    started with it waits for it instead of refusing it as no console."""
    starting = {"status": "starting", "database": {"ok": True}, "redis": {"ok": True}}
    ready = {**starting, "status": "ok", "workers": {"count": 1}}
    problem, note, asked = health_answers([starting, starting, ready])
    assert (problem, note, asked) == (None, None, 3)


def _lines(stream, into: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        into.put(line)
    into.put(None)


def _wait_for_line(lines: queue.Queue, pattern: str, seen: list[str], timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(seen)}")


def _in_session(session: int) -> list[psutil.Process]:
    left = []
    for process in psutil.process_iter():
        with suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getsid(process.pid) == session:
                left.append(process)
    return left


@pytest.mark.django_db(transaction=True)
def test_sigterm_ends_the_sandboxes_and_leaves_no_workload_behind(
    live_console, drill_team, tmp_path
):
    env = server_environment(BRAKELINE_DRILL_DIR=str(tmp_path / "drills"), PYTHONUNBUFFERED="1")
    command = [
        sys.executable,
        "manage.py",
        "drill",
        "--team",
        "research",
        "--scenario",
        "nan_loss",
        "--console-url",
        live_console,
    ]
    drill = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(drill.stdout, lines), daemon=True).start()
    seen: list[str] = []
    workload = None
    try:
        assert _wait_for_line(lines, r"sandboxes report to " + re.escape(live_console), seen, 60)
        started = _wait_for_line(lines, r"nan_loss\): workload started \(pid (\d+)\)", seen, 60)
        workload = int(started.group(1))
        assert _in_session(workload), "the workload leads a session of its own"
        drill.send_signal(signal.SIGTERM)
        stderr = drill.communicate(timeout=60)[1]
        assert drill.returncode == 130, stderr
        assert "Stopped before the drill set" in stderr and "Traceback" not in stderr, stderr
        assert _in_session(workload) == []  # no orphan (PPID 1) of the sandbox is left
        run = DrillRun.objects.get(team=drill_team)
        assert run.status == DrillStatus.ERROR and "stopped" in run.error, run.error
    finally:
        if drill.poll() is None:
            drill.kill()
            drill.wait()
        if workload is not None:  # a failing test must not leave it running either
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(workload, signal.SIGKILL)
