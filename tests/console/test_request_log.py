"""The request log: agent traffic summed up once a minute, people's requests and warnings seen.

A console under load takes many agent requests a second; a line for each would bury the line
saying an alert pages nobody. The last test runs Daphne as the demo and docker-compose.yml run
it (``--verbosity 0``: no access log) in the embedded mode, and reads what it printed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from console import request_log
from console.request_log import AgentTraffic
from tests.conftest import ROOT, free_port, wait_for_port

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

METRICS = "/api/v1/agent/metrics"
HEARTBEAT = "/api/v1/agent/heartbeat"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def request_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "brakeline.requests"]


def test_one_line_per_window_with_requests_points_and_refusals(caplog):
    caplog.set_level(logging.INFO, logger="brakeline.requests")
    clock = Clock()
    traffic = AgentTraffic(60.0, clock=clock)
    for second in range(59):
        clock.now = 1000.0 + second
        traffic.record(202, points=100)
    traffic.record(429)
    assert request_lines(caplog) == []
    clock.now = 1061.0
    traffic.record(200)
    assert request_lines(caplog) == [
        "agent traffic: 61 requests, 5900 points in the last 61 s (refused: 429 ×1)"
    ]
    assert caplog.records[-1].levelno == logging.INFO
    clock.now = 1062.0
    traffic.record(200)
    assert len(request_lines(caplog)) == 1  # the next window has only begun


@pytest.mark.django_db
def test_agent_requests_are_counted_not_logged_and_people_are_logged(
    caplog, monkeypatch, client, agent_post
):
    clock = Clock()
    monkeypatch.setattr(request_log, "_traffic", AgentTraffic(60.0, clock=clock))
    caplog.set_level(logging.INFO, logger="brakeline.requests")
    for step in range(5):
        agent_post(
            METRICS,
            {
                "points": [
                    {"name": "loss", "step": step, "value": 1.0},
                    {"name": "acc", "step": step, "value": 0.5},
                ]
            },
        )
    assert agent_post(HEARTBEAT, {"step": 4, "status": "running"}, token="bkl_nope").status_code
    assert client.get("/login/").status_code == 200
    assert request_lines(caplog) == [_line("GET /login/ 200", request_lines(caplog))]
    # Django's "Unauthorized: /api/v1/agent/heartbeat" warning is left to the summary too.
    assert not [r for r in caplog.records if "/api/v1/agent/" in r.getMessage()]
    clock.now += 60
    agent_post(HEARTBEAT, {"step": 5, "status": "running"})
    assert request_lines(caplog)[-1] == (
        "agent traffic: 7 requests, 10 points in the last 60 s (refused: 401 ×1)"
    )


def _line(prefix: str, lines: list[str]) -> str:
    """The line that starts with ``prefix`` (its duration varies)."""
    return next((line for line in lines if line.startswith(prefix)), f"<no {prefix!r} line>")


@pytest.mark.django_db
def test_a_person_meeting_an_error_is_a_warning_still(caplog, client):
    client.get("/api/v1/jobs/99999999")
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(r.name == "django.request" for r in warnings)


def test_where_we_start_daphne_its_access_log_is_off():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["web"]["command"]
    assert command[command.index("--verbosity") + 1] == "0"
    assert '"--verbosity", "0"' in (ROOT / "Dockerfile").read_text()
    demo = (ROOT / "console" / "management" / "commands" / "demo.py").read_text()
    assert '"--verbosity", "0"' in demo


def _post(url: str, token: str, body: dict) -> dict:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _summed_up(output: str) -> tuple[int, int]:
    """(requests, points) of every agent traffic line printed so far."""
    found = re.findall(r"agent traffic: (\d+) requests, (\d+) points", output)
    return sum(int(r) for r, _ in found), sum(int(p) for _, p in found)


def _wait_for_summary(log: Path, requests: int, deadline_seconds: float = 120.0) -> str:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        output = log.read_text()
        if _summed_up(output)[0] >= requests:
            return output
        time.sleep(0.2)
    raise AssertionError(f"not {requests} requests summed up in:\n{log.read_text()[-4000:]}")


@pytest.mark.embedded
def test_the_demos_console_prints_the_summary_and_the_warning(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.pop("BRAKELINE_SECRET_KEY", None)
    env.update(BRAKELINE_DATA_DIR=str(tmp_path), BRAKELINE_AGENT_TRAFFIC_LOG_SECONDS="1")
    _manage(env, "migrate", "--verbosity", "0")
    token = _manage(env, "create_job", "--team", "quiet", "--name", "toy").splitlines()[-1]
    port, log = free_port(), tmp_path / "console.log"
    with open(log, "w") as output:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "--verbosity",
                "0",
                "config.asgi:application",
            ],
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_port(port, server)
        base = f"http://127.0.0.1:{port}"
        for step in range(20):
            _post(f"{base}{HEARTBEAT}", token, {"step": step, "status": "running"})
        _post(f"{base}{METRICS}", token, {"points": [{"name": "loss", "step": 20, "value": "NaN"}]})
        urllib.request.urlopen(f"{base}/login/", timeout=30).close()
        time.sleep(1.1)
        _post(f"{base}{HEARTBEAT}", token, {"step": 21, "status": "running"})
        output = _wait_for_summary(log, 22)
    finally:
        server.terminate()
        server.wait(timeout=30)
    lines = output.splitlines()
    assert not [line for line in lines if "/api/v1/agent/" in line], output
    assert any("INFO brakeline.requests: GET /login/ 200" in line for line in lines), output
    assert _summed_up(output) == (22, 1), output
    assert any("INFO brakeline.requests: agent traffic: " in line for line in lines), output
    warnings = [line for line in lines if " WARNING " in line]
    assert len(warnings) == 1, output  # the one that matters, and no noise around it
    assert "WARNING incidents.notifications.rounds: team 'quiet' (id " in warnings[0], output
    assert ": L3 alert " in warnings[0] and "pages nobody" in warnings[0]
