"""The lean route of the agent hot path (console/agent_lean.py): which requests take it, and
what it answers when the console itself fails. What it answers for every protocol rule is
tested through both front doors by the protocol's own modules (BOTH_AGENT_DOORS)."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import pytest

from breakers.agent.protocol import PROTOCOL_VERSION
from console import request_log
from console.api import agent_endpoints
from console.api.agent_endpoints import (
    bundle,
    command_ack,
    heartbeat,
    metrics,
    replica_heartbeat,
    resolve,
)
from console.request_log import AgentTraffic
from tests.support.agent_doors import lean_post

HEARTBEAT = "/api/v1/agent/heartbeat"


@pytest.mark.parametrize(
    "path, handler, command_id",
    [
        ("/api/v1/agent/metrics", metrics, None),
        ("/api/v1/agent/heartbeat", heartbeat, None),
        ("/api/v1/agent/replicas/heartbeat", replica_heartbeat, None),
        ("/api/v1/agent/bundle", bundle, None),  # a node's forwarder: its ranks' requests
        ("/api/v1/agent/commands/42/ack", command_ack, 42),
        ("/api/v1/agent/commands/007/ack", command_ack, 7),  # as Django's <int:…> reads it
    ],
)
def test_the_hot_paths_take_the_lean_route(path, handler, command_id):
    route = resolve(path)
    assert route is not None and route.handler is handler and route.id == command_id


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/agent/snapshots",  # rare uploads: their DRF views
        "/api/v1/agent/checkpoints",
        "/api/v1/agent/metrics/",  # Django's URLs decide (404)
        "/api/v1/agent/commands/-1/ack",
        "/api/v1/agent/commands/x/ack",
        "/api/v1/agent/commands/" + "9" * 5000 + "/ack",  # more digits than int() takes
        "/api/v1/agent/commands/1/ack/extra",
        "/api/v1/jobs",
    ],
)
def test_other_paths_go_on_to_django(path):
    assert resolve(path) is None


@pytest.mark.django_db
@pytest.mark.parametrize("lean", [True, False])
def test_the_setting_turns_the_lean_route_off(agent, settings, lean):
    settings.AGENT_LEAN = lean
    reached: list[str] = []

    async def django_app(scope, receive, send) -> None:
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    body = json.dumps({"step": 1, "status": "running"}).encode()
    headers = {"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"}
    response = lean_post(HEARTBEAT, body, headers, django_app=django_app)
    if lean:
        assert response.status_code == 200 and reached == []
        assert response.json() == {"commands": []} and response["Brakeline-Protocol"] == str(
            PROTOCOL_VERSION
        )
    else:
        assert response.status_code == 204 and reached == [HEARTBEAT]


@pytest.mark.django_db
def test_a_failing_handler_is_a_json_500_logged_and_counted(agent, monkeypatch, caplog):
    def broken(job, body, command_id):
        raise ZeroDivisionError("a bug")

    monkeypatch.setitem(agent_endpoints.ENDPOINTS, HEARTBEAT, broken)
    traffic = AgentTraffic(60.0)
    monkeypatch.setattr(request_log, "_traffic", traffic)
    body = json.dumps({"step": 1, "status": "running"}).encode()
    headers = {"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"}
    with caplog.at_level(logging.ERROR, logger="django.request"):
        response = lean_post(HEARTBEAT, body, headers)
    assert response.status_code == 500 and response.json()["error"] == "server_error"
    assert any(record.exc_info for record in caplog.records), caplog.records
    assert traffic.requests == 1 and traffic.refused == {500: 1}


@pytest.mark.django_db(transaction=True)
def test_through_daphne_the_hot_path_skips_django_and_the_rest_does_not(live_console, agent):
    """Daphne serves config.asgi: a heartbeat is answered by the lean route (no middleware of
    Django's touched it: no X-Frame-Options), a snapshot upload by Django and DRF."""

    def post(path: str, body: dict) -> tuple[int, dict, dict]:
        request = urllib.request.Request(
            live_console + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {agent.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read())

    status, headers, answer = post(HEARTBEAT, {"step": 3, "status": "running"})
    assert (status, answer) == (200, {"commands": []})
    assert (
        headers["Brakeline-Protocol"] == str(PROTOCOL_VERSION) and "X-Frame-Options" not in headers
    )
    status, headers, answer = post(HEARTBEAT, {"step": "3", "status": "running"})
    assert status == 400 and "step" in answer["fields"] and "X-Frame-Options" not in headers
    status, headers, answer = post("/api/v1/agent/snapshots", {"kind": "start"})
    assert status == 400 and headers["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize("wait", [1, 30])
def test_the_lean_429_says_what_the_drf_throttle_says(wait):
    from rest_framework.exceptions import Throttled

    assert agent_endpoints.RateLimited(wait).detail == str(Throttled(wait).detail)
