"""The audit trail: every attempt, allowed or refused, and nobody can change it afterwards."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import Client

from breakers.control.job_actions import pause_job
from core.append_only import AppendOnlyError
from core.errors import Conflict, Forbidden
from incidents.models import AuditEntry, Job, JobStatus
from incidents.teams.audit import AuditContext, audited
from tests.support.authz import raise_alert

pytestmark = pytest.mark.django_db


def test_a_refused_attempt_is_audited_although_the_request_fails(scene):
    viewer = scene.api("viewer")
    response = viewer.client.post(
        f"/api/v1/jobs/{scene.job_id}/pause",
        {"reason": "let me"},
        content_type="application/json",
        headers={**viewer.headers, "User-Agent": "curl/8.5"},
        REMOTE_ADDR="10.1.2.3",
    )
    assert response.status_code == 403
    entry = AuditEntry.objects.get()
    assert (entry.user, entry.team_id, entry.role, entry.action) == (
        viewer.user,
        scene.team.pk,
        "viewer",
        "pause_job",
    )
    assert (entry.target_type, entry.target_id, entry.allowed) == ("job", scene.job_id, False)
    assert entry.reason == response.json()["detail"]
    assert (entry.outcome_code, entry.remote_addr, entry.user_agent, entry.via) == (
        "forbidden",
        "10.1.2.3",
        "curl/8.5",
        "token",
    )


def test_an_allowed_attempt_is_audited_with_its_outcome(scene):
    alert = raise_alert(scene.job_id, "L3")
    api = scene.api("oncall")
    response = api.post(f"/api/v1/alerts/{alert.pk}/acknowledge", {"note": "on it"})
    assert response.status_code == 200
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.level, entry.allowed, entry.outcome_code) == (
        "acknowledge_alert",
        "L3",
        True,
        "ok",
    )
    assert entry.reason == "An on-call engineer may acknowledge an alert."
    assert entry.outcome == f"alert #{alert.pk} acknowledged"
    again = api.post(f"/api/v1/alerts/{alert.pk}/acknowledge")
    assert again.status_code == 409
    assert api.user.username in again.json()["detail"]
    conflict = AuditEntry.objects.latest("id")
    assert (conflict.allowed, conflict.outcome_code) == (True, "conflict")


def test_a_failed_effect_leaves_no_ok_row_only_the_failure(scene):
    Job.objects.filter(pk=scene.job_id).update(status=JobStatus.TERMINATED)
    with pytest.raises(Conflict):
        pause_job(scene.person("oncall"), scene.job_id, reason="x")
    assert list(AuditEntry.objects.values_list("allowed", "outcome_code")) == [(True, "conflict")]


def test_an_ok_row_rolls_back_with_its_effect(scene):
    """The success row is written in the transition's transaction: a later failure in that
    transaction takes both back, and the failure is what the trail shows."""
    user = scene.person("manager")
    with pytest.raises(RuntimeError), audited(user, "pause_job", "job", 1) as attempt:
        attempt.allowed = True
        with transaction.atomic():
            attempt.succeeded("looked done")
            raise RuntimeError("the disk is full")
    assert list(AuditEntry.objects.values_list("outcome_code", "outcome")) == [
        ("error", "RuntimeError: the disk is full")
    ]


def test_service_callers_other_than_http_are_audited_too(scene):
    with pytest.raises(Forbidden):
        pause_job(
            scene.person("viewer"),
            scene.job_id,
            reason="x",
            context=AuditContext(via="websocket", remote_addr="::1"),
        )
    entry = AuditEntry.objects.get()
    assert (entry.via, entry.remote_addr) == ("websocket", "::1")


# --- Reading the trail ------------------------------------------------------------------------


def test_managers_read_their_teams_trail_others_are_refused(scene):
    scene.api("viewer").post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "x"})
    manager_view = scene.api("manager").get("/api/v1/audit", team=scene.team.pk)
    assert manager_view.status_code == 200
    rows = manager_view.json()
    assert [(r["action"], r["allowed"]) for r in rows] == [
        ("read_audit", True),  # reading the trail is itself recorded
        ("pause_job", False),
    ]
    refused = scene.api("oncall").get("/api/v1/audit", team=scene.team.pk)
    assert refused.status_code == 403 and "manager" in refused.json()["detail"]
    assert scene.api(None).get("/api/v1/audit", team=scene.team.pk).status_code == 404
    assert scene.api("oncall").get("/api/v1/audit").json() == []  # no team they may read
    only_refusals = scene.api("admin").get("/api/v1/audit", allowed="false").json()
    assert {r["allowed"] for r in only_refusals} == {False}


# --- Append-only, three times -------------------------------------------------------------------


@pytest.fixture
def entry(scene) -> AuditEntry:
    scene.api("viewer").post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "x"})
    return AuditEntry.objects.get()


def test_the_model_refuses_to_save_an_existing_row_or_delete_one(entry):
    entry.allowed = True
    with pytest.raises(AppendOnlyError):
        entry.save()
    with pytest.raises(AppendOnlyError):
        entry.delete()
    assert AuditEntry.objects.get(pk=entry.pk).allowed is False


@pytest.mark.parametrize(
    "change",
    [
        lambda qs: qs.update(allowed=True),
        lambda qs: qs.delete(),
        lambda qs: AuditEntry.objects.bulk_update(list(qs), ["allowed"]),
        lambda qs: qs.first().team.audit_entries.all().delete(),
    ],
    ids=["update", "delete", "bulk_update", "related_manager_delete"],
)
def test_the_queryset_refuses_updates_and_deletes(entry, change):
    with pytest.raises(AppendOnlyError):
        change(AuditEntry.objects.filter(pk=entry.pk))
    assert AuditEntry.objects.get(pk=entry.pk).allowed is False


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE incidents_auditentry SET allowed = true WHERE id = %s",
        "DELETE FROM incidents_auditentry WHERE id = %s",
    ],
    ids=["UPDATE", "DELETE"],
)
def test_postgresql_rejects_raw_sql_updates_and_deletes(entry, sql):
    assert connection.vendor == "postgresql"
    with (
        pytest.raises(IntegrityError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, [entry.pk])
    assert AuditEntry.objects.get(pk=entry.pk).allowed is False


def test_the_actor_and_the_team_cannot_be_deleted_from_under_the_trail(entry):
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError) as refused:
        entry.user.delete()
    assert entry in refused.value.protected_objects
    with pytest.raises(ProtectedError) as refused:
        entry.team.delete()
    assert entry in refused.value.protected_objects


def test_the_admin_has_no_way_to_change_it(admin_client, entry):
    assert admin_client.get(f"/admin/incidents/auditentry/{entry.pk}/change/").status_code in (
        200,
        403,
    )
    response = admin_client.post(f"/admin/incidents/auditentry/{entry.pk}/delete/")
    assert response.status_code == 403
    assert AuditEntry.objects.filter(pk=entry.pk).exists()


def test_when_and_where_are_recorded(scene):
    before = datetime.now(UTC)
    Client().post(f"/api/v1/jobs/{scene.job_id}/pause")  # not logged in: 401, no actor, no row
    scene.api("viewer").post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "x"})
    entry = AuditEntry.objects.get()
    assert before <= entry.at <= datetime.now(UTC)
    assert entry.remote_addr == "127.0.0.1"
