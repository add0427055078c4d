"""What the console does when a part is away (docs/degraded-modes.md), one claim per test.

"Redis is down" is a real Redis client aimed at a port where nothing listens (the shared Redis
of the suite keeps running for everybody else); the fault suite (tests/faults/) kills a real
one of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from datetime import timedelta
from functools import partial

import pytest
import redis
from django.db import OperationalError
from django.utils import timezone

from breakers.control import liveness
from breakers.control.commands import issue_command
from breakers.storage.points import stored_points
from console import agent_gate, ratelimit
from console.api import health
from console.api.errors import exception_handler, server_error
from console.ratelimit import RedisRateCounter
from incidents.alerts.lifecycle import raise_or_update_alert
from incidents.jobs import create_job
from incidents.models import NotificationPolicy, NotificationRound
from incidents.notifications.rounds import dispatch_alert
from incidents.notifications.sweep import sweep_deliveries, undispatched_alerts
from tests.conftest import free_port
from tests.incidents.test_notifications import nan_signal

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

pytestmark = pytest.mark.django_db


@pytest.fixture
def redis_down(monkeypatch) -> str:
    url = f"redis://127.0.0.1:{free_port()}/0"
    dead = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    monkeypatch.setattr(liveness, "_redis", lambda: dead)
    monkeypatch.setattr(ratelimit, "rate_counter", lambda: RedisRateCounter(url, "dead"))
    health._worker_cache.clear()
    yield url
    health._worker_cache.clear()


def test_with_redis_down_health_is_503_and_names_redis(client, redis_down):
    response = client.get("/api/v1/health")
    assert response.status_code == 503
    body = response.json()
    assert body["redis"]["ok"] is False and body["redis"]["error"]
    assert body["database"]["ok"] is True  # the database answers; Redis is the part down
    assert body["workers"]["count"] == 0 and body["status"] == "degraded"


def test_with_redis_down_metrics_still_land_and_heartbeats_still_carry_brakes(
    agent, agent_post, redis_down
):
    issued = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN", severity="L3")
    body = {"batch": "r-1", "points": [{"name": "loss", "step": 1, "value": "NaN"}]}
    metrics = agent_post("/api/v1/agent/metrics", body)
    assert metrics.status_code == 202, metrics.content
    assert len(stored_points(agent.job_id)) == 1
    heartbeat = agent_post("/api/v1/agent/heartbeat", {"step": 1, "status": "running"})
    assert heartbeat.status_code == 200
    assert [c["id"] for c in heartbeat.json()["commands"]] == [issued.command.pk]


@pytest.mark.parametrize(
    "error, part",
    [
        (OperationalError("connection refused"), "database"),
        (redis.exceptions.ConnectionError("refused"), "redis"),
        (redis.exceptions.TimeoutError("timed out"), "redis"),
    ],
)
def test_an_unreachable_part_answers_503_with_retry_after_never_500(error, part):
    response = exception_handler(error, {})
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert response.data["error"] == "unavailable" and part in response.data["detail"]


def test_a_bug_is_still_a_500_not_an_outage():
    assert exception_handler(ZeroDivisionError(), {}) is None  # Django's 500


def test_an_alert_whose_dispatch_was_lost_is_dispatched_by_the_sweep(
    django_capture_on_commit_callbacks,
):
    job = create_job("research", "lost-dispatch", "training").job
    assert NotificationPolicy.objects.filter(team=job.team).exists()  # every team has one
    raised = timezone.now() - timedelta(minutes=10)
    alert = raise_or_update_alert(job.pk, nan_signal(), now=raised).alert
    assert undispatched_alerts(timezone.now()) == [alert.pk]
    with django_capture_on_commit_callbacks() as callbacks:
        sweep_deliveries()
    assert len(callbacks) >= 1
    NotificationRound.objects.create(alert=alert, severity=alert.severity, number=0, due_at=raised)
    assert undispatched_alerts(timezone.now()) == []  # dispatched: never again


def test_a_team_without_a_policy_is_not_swept_for_dispatch():
    job = create_job("research", "no-policy", "training").job
    NotificationPolicy.objects.filter(team=job.team).delete()  # an admin removed it
    raise_or_update_alert(job.pk, nan_signal(), now=timezone.now() - timedelta(minutes=10))
    assert undispatched_alerts(timezone.now()) == []


def test_metrics_over_http_say_the_protocol_version(agent, agent_post):
    response = agent_post("/api/v1/agent/metrics", {"points": []})
    assert response["Brakeline-Protocol"] == "4" and json.loads(response.content)["accepted"] == 0


@contextlib.contextmanager
def read_only_database():
    """PostgreSQL refusing writes, as a standby or ``default_transaction_read_only`` does, for
    the connection this test's requests use (the test client runs views in this thread)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SET default_transaction_read_only = on")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET default_transaction_read_only = off")


@pytest.mark.django_db(transaction=True)
def test_with_a_read_only_database_agents_get_503_and_keep_their_points(make_agent, client):
    agent = make_agent()
    post = partial(client.post, content_type="application/json", headers=agent.headers)
    body = {"batch": "ro-1", "points": [{"name": "loss", "step": 1, "value": 1.0}]}
    with read_only_database():
        response = post("/api/v1/agent/metrics", json.dumps(body))
        heartbeat = post("/api/v1/agent/heartbeat", json.dumps({"step": 1, "status": "running"}))
        report = health.health_report(workers=1)[0]
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert "read-only" in response.json()["detail"]
    assert heartbeat.status_code == 503
    assert report["database"] == {"ok": False, "error": "read_only"}
    assert len(stored_points(agent.job_id)) == 0  # nothing half-written
    assert post("/api/v1/agent/metrics", json.dumps(body)).status_code == 202  # the retry lands
    assert len(stored_points(agent.job_id)) == 1


def test_an_outage_met_outside_the_api_views_is_a_503_too(rf):
    """Django's 500 handler sees the exception being handled: a database outage met in a
    middleware or a page (outside DRF's handler) answers 503 with Retry-After, a bug 500."""
    try:
        raise OperationalError("server closed the connection unexpectedly")
    except OperationalError:
        response = server_error(rf.get("/api/v1/agent/heartbeat"))
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert json.loads(response.content)["error"] == "unavailable"
    try:
        raise ZeroDivisionError
    except ZeroDivisionError:
        assert server_error(rf.get("/")).status_code == 500


def test_the_agent_gate_answers_503_when_the_token_lookup_meets_an_outage(monkeypatch):
    """The gate runs before Django's request cycle: without its own answer, Daphne would send
    a bare 500 for a PostgreSQL restart (seen in the fault suite), which agents stop retrying."""

    def lookup_fails(token: str) -> None:
        raise OperationalError("connection to server at 127.0.0.1 failed: Connection refused")

    monkeypatch.setattr(agent_gate, "_check_token", lookup_fails)
    sent: list[dict] = []

    async def never_called(scope, receive, send):
        raise AssertionError("the request must not reach Django")

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/agent/heartbeat",
        "headers": [(b"authorization", b"Bearer bkl_" + b"x" * 43)],
    }
    asyncio.run(agent_gate.AgentRequestGate(never_called)(scope, receive, send))
    assert sent[0]["status"] == 503 and (b"retry-after", b"1") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"] == "unavailable"


def test_an_alert_grouped_into_a_storm_is_not_dispatched_again_by_every_sweep():
    """Two L3s of one incident page once, through the first (the second's dispatch notes that
    it was grouped): the sweep must not take the second for a lost dispatch. Seen in the demo,
    where the guard's L3 beside the NaN's was dispatched again every 10 s."""
    job = create_job("research", "storm", "training").job
    raised = timezone.now() - timedelta(minutes=10)
    leader = raise_or_update_alert(job.pk, nan_signal(), now=raised).alert
    grouped_signal = replace(nan_signal(), rule_key="update-refused-by-guard", metric="guard")
    follower = raise_or_update_alert(job.pk, grouped_signal, now=raised).alert
    assert follower.incident_id == leader.incident_id
    dispatch_alert(leader.pk, now=raised)
    assert dispatch_alert(follower.pk, now=raised) == []  # grouped: no round of its own
    assert undispatched_alerts(timezone.now()) == []


@pytest.mark.django_db
@pytest.mark.parametrize("sqlstate", ["deadlock_detected", "serialization_failure"])
def test_a_conflicting_transaction_answers_503_naming_the_conflict_and_logs_the_cause(
    sqlstate, caplog
):
    """PostgreSQL's own refusal (raised by the real server with that SQLSTATE) is retried like
    an outage, but neither the answer nor the log calls the database unreachable."""
    from django.db import DatabaseError, connection, transaction

    with (
        pytest.raises(DatabaseError) as raised,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            f"DO $$ BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = '{sqlstate}'; END $$"
        )
    with caplog.at_level("WARNING", logger="brakeline.outages"):
        response = exception_handler(raised.value, {})
    assert response.status_code == 503 and response["Retry-After"] == "1"
    assert "conflicting" in response.data["detail"]
    assert "unreachable" not in response.data["detail"]
    assert any(
        "conflicting transaction" in r.getMessage() and "refused" in r.getMessage()
        for r in caplog.records
    )
