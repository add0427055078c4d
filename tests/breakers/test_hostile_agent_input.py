"""Nothing an agent sends can switch the brakes off: every input is hostile until parsed.

Each case is sent over HTTP (the Django test client; the body-before-authentication cases
also against the live Daphne): the answer is a 4xx naming the field, and nothing is written.
Times are built from the clock, so no case depends on today's date.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from breakers.control.commands import issue_command
from breakers.models import Command, EnvironmentSnapshot
from breakers.storage.points import any_points_stored, stored_points
from incidents.models import Job

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

pytestmark = pytest.mark.django_db

METRICS = "/api/v1/agent/metrics"
HEARTBEAT = "/api/v1/agent/heartbeat"
SNAPSHOTS = "/api/v1/agent/snapshots"
ACK = "/api/v1/agent/commands/{id}/ack"
HUGE = "1" + "0" * 400  # 10**400, a valid JSON integer


def iso(delta: timedelta) -> str:
    return (datetime.now(tz=UTC) + delta).isoformat()


def metrics(point: str) -> bytes:
    return ('{"points": [' + point + "]}").encode()


def snapshot(inner: str = '{"python": {"version": "3.11"}}', **top: str) -> bytes:
    fields = {"kind": '"start"', "step": "0", "snapshot": inner, **top}
    return ("{" + ", ".join(f'"{key}": {value}' for key, value in fields.items()) + "}").encode()


# (endpoint, body, content type, status, field named in the answer)
CASES = {
    # -- metrics ------------------------------------------------------------------------------
    "step 10**400": (
        METRICS,
        metrics('{"name": "loss", "step": ' + HUGE + ', "value": 1}'),
        None,
        400,
        "points[0].step",
    ),
    "value 10**400": (
        METRICS,
        metrics('{"name": "loss", "step": 1, "value": ' + HUGE + "}"),
        None,
        400,
        "points[0].value",
    ),
    "value 1e400": (
        METRICS,
        metrics('{"name": "loss", "step": 1, "value": 1e400}'),
        None,
        400,
        "points[0].value",
    ),
    "value -1e400": (
        METRICS,
        metrics('{"name": "loss", "step": 1, "value": -1e400}'),
        None,
        400,
        "points[0].value",
    ),
    "nested 10**5 deep": (
        METRICS,
        b'{"points": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        None,
        400,
        "body",
    ),
    "nested 40 deep": (
        METRICS,
        b'{"points": ' + b"[" * 40 + b"]" * 40 + b"}",
        None,
        400,
        "points[0]",
    ),
    "result nested 40 deep": (
        ACK,
        b'{"status": "succeeded", "result": {"a": ' + b"[" * 40 + b"]" * 40 + b"}}",
        None,
        400,
        "body",
    ),
    "NUL in a name": (
        METRICS,
        metrics('{"name": "lo\\u0000ss", "step": 1, "value": 1}'),
        None,
        400,
        "points[0].name",
    ),
    "lone surrogate in a name": (
        METRICS,
        metrics('{"name": "loss\\ud800", "step": 1, "value": 1}'),
        None,
        400,
        "points[0].name",
    ),
    "lone surrogate in a node": (
        METRICS,
        metrics('{"name": "loss", "step": 1, "value": 1, "node": "\\udfff"}'),
        None,
        400,
        "points[0].node",
    ),
    "NUL in a node": (
        METRICS,
        metrics('{"name": "loss", "step": 1, "value": 1, "node": "n\\u0000"}'),
        None,
        400,
        "points[0].node",
    ),
    "duplicate key in a point": (
        METRICS,
        metrics('{"name": "loss", "name": "other", "step": 1, "value": 1}'),
        None,
        400,
        "name",
    ),
    "duplicate points": (METRICS, b'{"points": [], "points": []}', None, 400, "points"),
    "time year 1 (+05:00)": (
        METRICS,
        metrics('{"name": "loss", "step": 1, "value": 1, "time": "0001-01-01T00:00:00+05:00"}'),
        None,
        400,
        "points[0].time",
    ),
    "time year 9999 (-05:00)": (
        METRICS,
        metrics('{"name": "loss", "step": 1, "value": 1, "time": "9999-12-31T23:00:00-05:00"}'),
        None,
        400,
        "points[0].time",
    ),
    "time two days ahead": (
        METRICS,
        metrics(
            f'{{"name": "loss", "step": 1, "value": 1, "time": "{iso(timedelta(days=2))}"' + "}"
        ),
        None,
        400,
        "points[0].time",
    ),
    "time two days ago": (
        METRICS,
        metrics(
            f'{{"name": "loss", "step": 1, "value": 1, "time": "{iso(-timedelta(days=2))}"' + "}"
        ),
        None,
        400,
        "points[0].time",
    ),
    "text/plain": (
        METRICS,
        metrics('{"name": "loss", "step": 1, "value": 1}'),
        "text/plain",
        415,
        "Content-Type",
    ),
    "form encoded": (
        METRICS,
        b"points=1",
        "application/x-www-form-urlencoded",
        415,
        "Content-Type",
    ),
    "UTF-16 body": (
        METRICS,
        '{"points": [{"name": "loss", "step": 1, "value": 1}]}'.encode("utf-16"),
        None,
        400,
        "body",
    ),
    "UTF-16 without BOM": (METRICS, '{"points": []}'.encode("utf-16-le"), None, 400, "body"),
    "charset utf-16": (
        METRICS,
        b'{"points": []}',
        "application/json; charset=utf-16",
        400,
        "Content-Type",
    ),
    # -- heartbeat ----------------------------------------------------------------------------
    "rank 2**40": (
        HEARTBEAT,
        b'{"step": 1, "status": "running", "rank": 1099511627776}',
        None,
        400,
        "rank",
    ),
    "heartbeat step 10**400": (
        HEARTBEAT,
        ('{"step": ' + HUGE + ', "status": "running"}').encode(),
        None,
        400,
        "step",
    ),
    "NUL in a hostname": (
        HEARTBEAT,
        b'{"step": 1, "status": "running", "hostname": "a\\u0000"}',
        None,
        400,
        "hostname",
    ),
    "surrogate in a hostname": (
        HEARTBEAT,
        b'{"step": 1, "status": "running", "hostname": "\\ud83d"}',
        None,
        400,
        "hostname",
    ),
    "NUL in a nodelist": (
        HEARTBEAT,
        b'{"step": 1, "status": "running", "slurm_nodelist": "n[1-2]\\u0000"}',
        None,
        400,
        "slurm_nodelist",
    ),
    "duplicate step": (
        HEARTBEAT,
        b'{"step": 1, "step": 2, "status": "running"}',
        None,
        400,
        "step",
    ),
    "heartbeat as text": (
        HEARTBEAT,
        b'{"step": 1, "status": "running"}',
        "text/plain",
        415,
        "Content-Type",
    ),
    # -- acknowledgements ---------------------------------------------------------------------
    "NaN in a result": (
        ACK,
        b'{"status": "succeeded", "result": {"loss": NaN}}',
        None,
        400,
        "result.loss",
    ),
    "Infinity in a result": (
        ACK,
        b'{"status": "succeeded", "result": {"x": [1, Infinity]}}',
        None,
        400,
        "result.x[1]",
    ),
    "1e400 in a result": (
        ACK,
        b'{"status": "succeeded", "result": {"x": 1e400}}',
        None,
        400,
        "result.x",
    ),
    "NUL in a result": (
        ACK,
        b'{"status": "succeeded", "result": {"path": "/c\\u0000"}}',
        None,
        400,
        "result.path",
    ),
    "NUL in a result key": (
        ACK,
        b'{"status": "succeeded", "result": {"a\\u0000": 1}}',
        None,
        400,
        "result",
    ),
    "NUL in an error": (ACK, b'{"status": "failed", "error": "boom\\u0000"}', None, 400, "error"),
    "result nested 10**5 deep": (
        ACK,
        b'{"status": "succeeded", "result": {"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
        None,
        400,
        "body",
    ),
    # -- snapshots ----------------------------------------------------------------------------
    "NUL in a snapshot string": (
        SNAPSHOTS,
        snapshot('{"python": {"version": "3\\u0000"}}'),
        None,
        400,
        "snapshot.python.version",
    ),
    "surrogate in a snapshot key": (
        SNAPSHOTS,
        snapshot('{"git": {"\\ud800": "x"}}'),
        None,
        400,
        "snapshot.git",
    ),
    "1e400 in a snapshot": (
        SNAPSHOTS,
        snapshot('{"resources": {"memory": 1e400}}'),
        None,
        400,
        "snapshot.resources.memory",
    ),
    "taken_at year 1": (
        SNAPSHOTS,
        snapshot('{"taken_at": "0001-01-01T00:00:00+05:00"}'),
        None,
        400,
        "snapshot.taken_at",
    ),
    "taken_at three days ahead": (
        SNAPSHOTS,
        snapshot('{"taken_at": "' + iso(timedelta(days=3)) + '"}'),
        None,
        400,
        "snapshot.taken_at",
    ),
    "snapshot step 10**400": (SNAPSHOTS, snapshot(step=HUGE), None, 400, "step"),
    "duplicate kind": (
        SNAPSHOTS,
        b'{"kind": "start", "kind": "checkpoint", "step": 0, "snapshot": {}}',
        None,
        400,
        "kind",
    ),
    "snapshot as form": (
        SNAPSHOTS,
        snapshot(),
        "multipart/form-data; boundary=x",
        415,
        "Content-Type",
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_hostile_input_is_a_4xx_naming_the_field_and_nothing_is_written(
    case, agent, agent_post, client
):
    endpoint, body, content_type, status, field = CASES[case]
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="test", severity="L3")
    path = endpoint.format(id=command.command.pk)
    job_before = Job.objects.values().get(pk=agent.job_id)
    response = client.post(
        path,
        data=body,
        content_type=content_type or "application/json",
        headers=agent.headers,
    )
    assert response.status_code == status, response.content
    answer = response.json()
    assert set(answer) == {"error", "detail", "fields"}
    assert field in answer["fields"], answer
    assert not any_points_stored()
    assert EnvironmentSnapshot.objects.count() == 0
    assert Command.objects.get(pk=command.command.pk).status == command.command.status
    job_after = Job.objects.values().get(pk=agent.job_id)
    assert job_after == job_before


def test_a_command_id_beyond_a_bigint_is_404(agent, agent_post):
    response = agent_post(ACK.format(id=10**30), {"status": "succeeded"})
    assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_times_inside_the_window_are_accepted(agent, agent_post):
    body = {
        "points": [
            {"name": "loss", "step": 1, "value": 1.0, "time": iso(-timedelta(hours=23))},
            {"name": "loss", "step": 2, "value": 1.0, "time": iso(timedelta(hours=23))},
        ]
    }
    assert agent_post(METRICS, body).status_code == 202
    assert len(stored_points(agent.job_id)) == 2


def test_the_window_is_the_setting(agent, agent_post, settings):
    settings.AGENT_TIME_WINDOW_SECONDS = 60.0
    body = {"points": [{"name": "loss", "step": 1, "value": 1.0, "time": iso(-timedelta(hours=1))}]}
    response = agent_post(METRICS, body)
    assert response.status_code == 400
    assert "60 seconds" in response.json()["fields"]["points[0].time"]


def test_the_bare_literals_still_mean_non_finite(agent, agent_post):
    body = b'{"points": [{"name": "loss", "step": 1, "value": NaN}]}'
    assert agent_post(METRICS, body).status_code == 202


def test_an_empty_body_without_a_type_is_malformed_json(agent, agent_post):
    response = agent_post(METRICS, b"")
    assert response.status_code == 400 and response.json()["error"] == "malformed_json"


# -- the body is read only after authentication, and bounded -----------------------------------


def _post_raw(url: str, body: bytes, token: str | None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.django_db(transaction=True)
def test_an_oversized_body_is_401_without_a_token_and_413_with_one(live_console, agent, settings):
    oversized = b'{"points": [' + b" " * (settings.AGENT_MAX_BATCH_BYTES + 10) + b"]}"
    status, answer = _post_raw(live_console + METRICS, oversized, None)
    assert status == 401 and answer["error"] == "missing_token"
    status, answer = _post_raw(live_console + METRICS, oversized, "not-a-token")
    assert status == 401 and answer["error"] == "unknown_token"
    status, answer = _post_raw(live_console + METRICS, oversized, agent.token)
    assert status == 413 and "body" in answer["fields"]
    assert not any_points_stored()


@pytest.mark.django_db(transaction=True)
def test_the_gate_reads_no_byte_before_the_token_is_known(agent, settings):
    """The ASGI gate itself: an unauthenticated request's body is never received; one over the
    limit is received only up to the limit."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    from console.agent_gate import AgentRequestGate

    received: list[int] = []
    sent: list[dict] = []
    called: list[bytes] = []
    chunk = b" " * 65536

    async def receive() -> dict:
        received.append(len(chunk))
        return {"type": "http.request", "body": chunk, "more_body": True}  # never ends

    async def send(message: dict) -> None:
        sent.append(message)

    async def app(scope, receive, send):  # pragma: no cover - must not be reached
        called.append(b"")

    def scope(token: str | None) -> dict:
        headers = [(b"content-type", b"application/json")]
        if token is not None:
            headers.append((b"authorization", f"Bearer {token}".encode()))
        return {"type": "http", "method": "POST", "path": METRICS, "headers": headers}

    gate = AgentRequestGate(app)
    asyncio.run(gate(scope(None), receive, send))
    assert sent[0]["status"] == 401 and received == [] and called == []
    sent.clear()
    asyncio.run(gate(scope(agent.token), receive, send))
    assert sent[0]["status"] == 413 and called == []
    assert sum(received) <= settings.AGENT_MAX_BATCH_BYTES + len(chunk)
    # The token lookup ran in asgiref's thread: close its connection before the flush.
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("declared", [b"9" * 5000, "²".encode(), b"-5", b"1_0"])
def test_the_gate_takes_any_content_length_without_an_error(agent, declared):
    """A declared length of 5,000 digits (int() refuses it), a superscript digit (isdigit()
    takes it, int() does not) or a sign: the gate answered 500; now the huge one is 413 and the
    malformed ones say nothing (the body's read is bounded anyway)."""
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    from console.agent_gate import AgentRequestGate

    sent: list[dict] = []
    reached: list[bytes] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b'{"points": []}', "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    async def app(scope, receive, send):
        reached.append(b"")

    headers = [
        (b"content-type", b"application/json"),
        (b"authorization", f"Bearer {agent.token}".encode()),
        (b"content-length", declared),
    ]
    scope = {"type": "http", "method": "POST", "path": METRICS, "headers": headers}
    asyncio.run(AgentRequestGate(app)(scope, receive, send))
    if declared == b"9" * 5000:
        assert sent[0]["status"] == 413 and reached == []
    else:
        assert reached == [b""]  # handed on: the view reads the bounded body
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())
