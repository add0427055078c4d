"""Evaluation fails safe: one job whose evaluation raises cannot stop another job's brakes,
and is itself an L3 alert ("the breakers of job X are failing"), paged and in /api/v1/health."""

from __future__ import annotations

import pytest

from breakers.detection import evaluation, tasks
from breakers.detection.rules import install_default_pack
from breakers.models import Command, CommandKind, EvaluationState
from incidents.models import Alert, Incident, Job

pytestmark = pytest.mark.django_db

METRICS = "/api/v1/agent/metrics"


def nan_batch() -> dict:
    healthy = [{"name": "loss", "step": step, "value": 2.0 + step % 7 * 0.01} for step in range(60)]
    return {"points": [*healthy, {"name": "loss", "step": 60, "value": "NaN"}]}


@pytest.fixture
def eager(request, settings):
    """Tasks run in process, as in the embedded mode: the tick's loop calls each job's tick."""
    from config.celery import app

    was_eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    settings.CELERY_TASK_ALWAYS_EAGER = True
    request.addfinalizer(lambda: setattr(app.conf, "task_always_eager", was_eager))


@pytest.fixture
def paged(monkeypatch) -> list[int]:
    """The alerts handed to notify_alert (it pages the on-call after commit)."""
    ids: list[int] = []
    original = evaluation.notify_alert

    def record(alert_id: int) -> None:
        ids.append(alert_id)
        original(alert_id)

    monkeypatch.setattr(evaluation, "notify_alert", record)
    return ids


def test_a_raising_job_is_an_l3_alert_and_another_jobs_nan_is_still_braked(
    make_agent, client, eager, paged, monkeypatch
):
    install_default_pack()
    broken, healthy = make_agent(name="broken"), make_agent(name="healthy")
    for agent in (broken, healthy):
        response = client.post(
            METRICS, nan_batch(), content_type="application/json", headers=agent.headers
        )
        assert response.status_code == 202
    # The broken job's stored state makes its engine raise (a state no code path can read).
    EvaluationState.objects.update_or_create(job_id=broken.job_id, defaults={"state": {"x": 1}})
    original = evaluation._restore

    def restore(rules, stored, job_id):
        if job_id == broken.job_id:
            raise RuntimeError("timestamp too small")
        return original(rules, stored, job_id)

    monkeypatch.setattr(evaluation, "_restore", restore)

    assert tasks.tick_evaluations() == 2  # the periodic loop over jobs went on past the broken one

    failing = Alert.objects.get(job_id=broken.job_id, rule_key=evaluation.BREAKERS_FAILING_RULE)
    assert failing.severity == "L3" and failing.layer == "health"
    assert "the breakers of job broken are failing" in failing.description
    assert "timestamp too small" in failing.description
    assert Incident.objects.filter(job_id=broken.job_id).exists()
    assert failing.pk in paged
    # The healthy job's NaN was braked regardless.
    nan_alert = Alert.objects.get(job_id=healthy.job_id, severity="L3", layer="stability")
    assert Command.objects.get(job_id=healthy.job_id).kind == CommandKind.CHECKPOINT_AND_PAUSE
    assert nan_alert.pk in paged

    # A second failure updates the same alert and pages nobody twice.
    tasks.evaluate_job(broken.job_id)
    assert Alert.objects.filter(rule_key=evaluation.BREAKERS_FAILING_RULE).count() == 1
    assert paged.count(failing.pk) == 1

    health = client.get("/api/v1/health").json()
    assert health["status"] == "degraded"
    assert [entry["job_id"] for entry in health["failing_breakers"]] == [broken.job_id]
    assert "broken" not in str(health["failing_breakers"])  # public: ids only

    # Fixed: the next evaluation succeeds and resolves it.
    monkeypatch.setattr(evaluation, "_restore", original)
    tasks.evaluate_job(broken.job_id)
    failing.refresh_from_db()
    assert failing.status == "resolved"
    assert client.get("/api/v1/health").json()["failing_breakers"] == []
    assert Job.objects.get(pk=healthy.job_id).status == "pausing"


def test_a_transient_database_error_is_retried_not_reported(agent, monkeypatch):
    from django.db import OperationalError

    def fail(*args, **kwargs):
        raise OperationalError("connection lost")

    monkeypatch.setattr(evaluation, "evaluate_job", fail)
    with pytest.raises(OperationalError):
        tasks.fail_safe(agent.job_id)
    assert not Alert.objects.filter(rule_key=evaluation.BREAKERS_FAILING_RULE).exists()
