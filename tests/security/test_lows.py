"""The low findings: the Alertmanager webhook (throttled; no team-wide lock for a whole batch;
a resolved episode replayed opens nothing) and an on-call time with an offset PostgreSQL
cannot hold (a 400 naming the field, not a 500)."""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from breakers.models import ExternalAlert, IntegrationToken, NodeBinding
from breakers.monitoring import receiver
from console.ratelimit import rate_counter
from incidents.jobs import create_job
from incidents.models import Alert, Job, Team
from tests.breakers.monitoring.test_alertmanager_receiver import alert, post, webhook


@pytest.mark.django_db
@pytest.mark.parametrize("offset", ["-17:46", "+23:59", "+14:01"])
def test_an_on_call_time_with_an_impossible_offset_is_a_400_naming_it(scene, offset):
    url = f"/api/v1/teams/{scene.team.pk}/oncall"
    answer = scene.api("viewer").get(url, at=f"2026-01-01T00:00:00{offset}")
    assert answer.status_code == 400 and "at" in answer.json()["fields"]
    assert scene.api("viewer").get(url, at="2026-01-01T00:00:00+14:00").status_code == 200


@pytest.fixture
def bound_job(db):
    job = create_job("research", "pretrain").job
    Job.objects.filter(pk=job.pk).update(status="running", current_step=10)
    NodeBinding.objects.create(job=job, hostname="gpu-b", source="operator")
    team = Team.objects.get(name="research")
    return job, team, IntegrationToken.issue(team, "alertmanager")[1]


@pytest.mark.django_db
def test_a_resolved_alert_replayed_with_its_fingerprint_and_start_opens_nothing(client, bound_job):
    job, _, token = bound_job
    firing = alert("gpu-b", 0, xid="48")
    assert post(client, token, webhook([firing])).status_code == 200
    resolved = {**firing, "status": "resolved", "endsAt": "2026-12-02T01:05:00Z"}
    assert post(client, token, webhook([resolved], "resolved")).status_code == 200
    assert not Alert.objects.filter(job=job, status__in=["firing", "acknowledged"]).exists()
    replay = post(client, token, webhook([firing]))
    assert replay.status_code == 200 and replay.json()["new"] == 0
    assert not ExternalAlert.objects.filter(status="firing").exists()
    assert not Alert.objects.filter(job=job, status__in=["firing", "acknowledged"]).exists()


@pytest.mark.django_db(transaction=True)
def test_a_webhook_never_holds_the_teams_row_for_its_whole_batch(client, bound_job, monkeypatch):
    job, team, token = bound_job
    seen: list[bool] = []
    original = receiver._fire

    def lockable_meanwhile() -> None:
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute(
                    "SELECT 1 FROM incidents_team WHERE id = %s FOR UPDATE NOWAIT", [team.pk]
                )
                cursor.execute("ROLLBACK")
            seen.append(True)
        except Exception:
            seen.append(False)
        finally:
            other.close()

    def fire_and_look(*args, **kwargs):
        original(*args, **kwargs)
        probe = threading.Thread(target=lockable_meanwhile)
        probe.start()
        probe.join()

    monkeypatch.setattr(receiver, "_fire", fire_and_look)
    alerts = [alert("gpu-b", gpu) for gpu in range(3)]
    assert post(client, token, webhook(alerts)).status_code == 200
    assert seen == [True, True, True]


@pytest.mark.django_db
def test_webhooks_past_the_teams_rate_are_a_429(client, bound_job, settings):
    _, team, token = bound_job
    rates = {**settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], "alertmanager": "2/min"}
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": rates}
    key = f"alertmanager:{team.pk}"
    rate_counter().reset(key)
    try:
        answers = [post(client, token, webhook([alert("gpu-b", n)])).status_code for n in range(3)]
        assert answers == [200, 200, 429]
    finally:
        rate_counter().reset(key)
