"""/metrics: refused unless configured, the token checked, the figures from the tables."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from prometheus_client.parser import text_string_to_metric_families

from breakers.control.acknowledge import acknowledge_command
from breakers.control.braking import system_command
from incidents.jobs import create_job
from incidents.models import Job
from tests.support.authz import raise_alert

pytestmark = pytest.mark.django_db


def _families(response) -> dict:
    return {f.name: f for f in text_string_to_metric_families(response.content.decode())}


def _bucket(families: dict, name: str, le: str) -> float:
    (value,) = [
        s.value
        for s in families[name].samples
        if s.name == f"{name}_bucket" and s.labels["le"] == le
    ]
    return value


def test_metrics_are_off_until_configured(client, settings):
    settings.METRICS_TOKEN, settings.METRICS_PUBLIC = "", False
    assert client.get("/metrics").status_code == 404


def test_the_token_is_checked(client, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_the_figures_come_from_the_tables(client, settings):
    settings.METRICS_TOKEN, settings.METRICS_PUBLIC = "", True
    job = create_job("research", "llm").job
    Job.objects.filter(pk=job.pk).update(status="running")
    alert = raise_alert(job.pk, "L3")
    command = system_command(
        job.pk, "checkpoint_and_pause", level="L3", reason="test", key="k", alert_id=alert.pk
    )
    response = client.get("/metrics")
    assert response["Content-Type"].startswith("text/plain")
    families = _families(response)
    firing = {
        (s.labels["level"], s.labels["layer"]): s.value
        for s in families["brakeline_alerts_firing"].samples
    }
    assert firing[("L3", "stability")] == 1 and firing[("L4", "health")] == 0
    commands = {
        (s.labels["kind"], s.labels["status"]): s.value
        for s in families["brakeline_commands"].samples
        if s.name == "brakeline_commands_total"
    }
    assert list(commands) == [("checkpoint_and_pause", "pending")]
    assert list(commands.values()) == [1]
    assert _bucket(families, "brakeline_brake_latency_seconds", "+Inf") == 0

    # The job acknowledges its brake 1.5 s after the alert was raised: one observation.
    with time_machine.travel(alert.raised_at + timedelta(seconds=1.5), tick=False):
        acknowledge_command(job.pk, command.pk, status="succeeded")
    families = _families(client.get("/metrics"))
    assert _bucket(families, "brakeline_brake_latency_seconds", "1.0") == 0
    assert _bucket(families, "brakeline_brake_latency_seconds", "2.5") == 1
    assert _bucket(families, "brakeline_brake_latency_seconds", "+Inf") == 1
    for name in (
        "brakeline_evaluation_lag_seconds",
        "brakeline_heartbeat_deadline_misses",
        "brakeline_queue_depth",
        "brakeline_notification_deliveries",
        "brakeline_watchdog_age_seconds",
        "brakeline_external_alerts_firing",
    ):
        assert name in families, name
