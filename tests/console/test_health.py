"""/api/v1/health: the watchdog for the watchdog."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from breakers.control import liveness
from breakers.control.commands import issue_command
from breakers.control.watchdog import BEAT, watchdog_tick
from breakers.models import CommandStatus
from console.api import health

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def forget_beat():
    liveness._redis().delete(liveness._key(BEAT))
    health._worker_cache.clear()
    yield
    health._worker_cache.clear()


def test_no_beat_ever_is_503_and_says_so(client):
    response = client.get("/api/v1/health")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "degraded" and body["beat"]["stale"] is True
    assert body["beat"]["last_run_age_seconds"] is None
    assert body["queue"]["depth"] >= 0


def test_a_console_that_just_started_says_starting_without_an_error(
    client, settings, monkeypatch, caplog
):
    """Before its first beat, a fresh web process is not ready (503) but nothing is wrong: no
    error line in the log. After the grace a missing beat is "degraded" and logged."""
    settings.HEALTH_STARTING_SECONDS = 15.0
    monkeypatch.setattr(health, "_STARTED_AT", time.monotonic() - 2)
    with caplog.at_level("INFO"):
        response = client.get("/api/v1/health")
    assert response.status_code == 503 and response.json()["status"] == "starting"
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    monkeypatch.setattr(health, "_STARTED_AT", time.monotonic() - 20)
    caplog.clear()
    with caplog.at_level("INFO"):
        response = client.get("/api/v1/health")
    assert response.status_code == 503 and response.json()["status"] == "degraded"
    assert [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


def test_a_stale_beat_is_503_with_its_age(client):
    liveness.record(BEAT, time.time() - 60)
    body = client.get("/api/v1/health").json()
    assert body["beat"]["stale"] is True and body["beat"]["last_run_age_seconds"] >= 59


def test_no_workers_is_degraded_even_with_a_fresh_beat():
    watchdog_tick(lambda command_id: None)
    report, healthy = health.health_report(workers=0)
    assert report["beat"]["stale"] is False and report["beat"]["last_run_age_seconds"] < 5
    assert report["workers"] == {"count": 0, "stale": True} and not healthy


def test_a_fresh_beat_and_a_worker_is_healthy():
    watchdog_tick(lambda command_id: None)
    report, healthy = health.health_report(workers=2)
    assert healthy and report["status"] == "ok"


def test_the_endpoint_answers_what_the_report_says(client):
    watchdog_tick(lambda command_id: None)
    response = client.get("/api/v1/health")
    workers = response.json()["workers"]["count"]
    assert response.status_code == (200 if workers > 0 else 503)


def test_the_tick_expires_overdue_commands_and_hands_them_on(
    agent, django_capture_on_commit_callbacks
):
    command = issue_command(agent.job_id, "terminate", reason="XID").command
    type(command).objects.filter(pk=command.pk).update(
        deliver_by=timezone.now() - timedelta(seconds=1)
    )
    handed = []
    with django_capture_on_commit_callbacks(execute=True):
        assert watchdog_tick(handed.append) == [command.pk]
    assert handed == [command.pk]
    command.refresh_from_db()
    assert command.status == CommandStatus.EXPIRED
