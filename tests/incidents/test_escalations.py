"""L2 escalation requests: request → approve (the command reaches the job) / reject / expire."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from breakers.control.escalations import approve_escalation, expire_escalations
from breakers.models import Command
from core.errors import Conflict, Forbidden
from incidents import escalations
from incidents.models import (
    AuditEntry,
    EscalationRequest,
    EscalationStatus,
    Job,
    JobStatus,
    TimelineEntry,
)
from tests.support.authz import Scene, raise_alert

pytestmark = pytest.mark.django_db


def ask(scene: Scene, requester, *, kind="checkpoint_and_pause", params=None, **extra):
    alert = extra.pop("alert", None) or raise_alert(scene.job_id, "L2")
    body = {
        "job_id": scene.job_id,
        "alert_id": alert.pk,
        "command": {"kind": kind, "params": params or {}},
        "reason": "loss > 4σ for 10 minutes and rising",
        **extra,
    }
    return requester.post("/api/v1/escalations", body)


def heartbeat(scene: Scene) -> list[dict]:
    response = Client().post(
        "/api/v1/agent/heartbeat",
        json.dumps({"step": 7, "status": "running"}),
        content_type="application/json",
        headers=scene.agent_headers,
    )
    return response.json()["commands"]


def timeline_kinds(incident_id: int) -> list[str]:
    return list(
        TimelineEntry.objects.filter(incident_id=incident_id).values_list("kind", flat=True)
    )


def test_an_approved_l2_escalation_reaches_the_job_as_a_command(scene):
    oncall, manager = scene.api("oncall"), scene.api("manager")
    created = ask(scene, oncall, kind="lower_lr", params={"factor": 0.1})
    assert created.status_code == 201, created.content
    request = created.json()
    assert (request["status"], request["level"], request["requested_by"]) == (
        "pending",
        "L2",
        oncall.user.username,
    )
    assert heartbeat(scene) == []  # nothing happens before a manager approves

    approved = manager.post(f"/api/v1/escalations/{request['id']}/approve", {"note": "go"})
    assert approved.status_code == 200, approved.content
    assert approved.json()["status"] == "approved"
    command = Command.objects.get()
    assert approved.json()["command_id"] == command.pk
    assert (command.idempotency_key, command.issued_by, command.severity) == (
        f"escalation:{request['id']}",
        manager.user,
        "L2",
    )
    [sent] = heartbeat(scene)
    assert (sent["id"], sent["kind"], sent["params"]) == (command.pk, "lower_lr", {"factor": 0.1})
    assert f"Escalation #{request['id']} approved by {manager.user}" in sent["reason"]
    kinds = timeline_kinds(request["incident_id"])
    assert kinds[-3:] == ["escalation_requested", "escalation_approved", "command_issued"]
    approved_row = TimelineEntry.objects.get(kind="escalation_approved")
    assert (approved_row.actor_kind, approved_row.actor) == ("person", manager.user)


def test_nobody_approves_or_rejects_their_own_request(scene):
    manager = scene.api("manager")  # a manager may request too; still not decide it
    request = ask(scene, manager).json()
    for verb in ("approve", "reject"):
        response = manager.post(f"/api/v1/escalations/{request['id']}/{verb}")
        assert response.status_code == 403
        assert "they made themselves" in response.json()["detail"]
    assert EscalationRequest.objects.get().status == EscalationStatus.PENDING
    assert not Command.objects.exists()
    refusals = AuditEntry.objects.filter(user=manager.user, allowed=False)
    assert sorted(refusals.values_list("action", flat=True)) == [
        "approve_escalation",
        "reject_escalation",
    ]


def test_a_rejected_request_sends_nothing_and_cannot_be_approved_after(scene):
    request = ask(scene, scene.api("oncall")).json()
    manager, admin = scene.api("manager"), scene.api("admin")
    rejected = manager.post(f"/api/v1/escalations/{request['id']}/reject", {"note": "noise"})
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
    late = admin.post(f"/api/v1/escalations/{request['id']}/approve")
    assert late.status_code == 409
    assert f"already rejected by {manager.user}" in late.json()["detail"]
    assert not Command.objects.exists()
    assert timeline_kinds(request["incident_id"])[-1] == "escalation_rejected"


def test_oncall_cannot_decide_and_viewer_cannot_request(scene):
    request = ask(scene, scene.api("oncall")).json()
    response = scene.api("oncall").post(f"/api/v1/escalations/{request['id']}/approve")
    assert response.status_code == 403 and "manager" in response.json()["detail"]
    assert ask(scene, scene.api("viewer")).status_code == 403


def test_one_pending_request_per_job_and_kind(scene):
    first = ask(scene, scene.api("oncall"))
    second = ask(scene, scene.api("admin"))
    assert first.status_code == 201 and second.status_code == 409
    assert f"#{first.json()['id']}" in second.json()["detail"]
    assert (
        ask(scene, scene.api("admin"), kind="lower_lr", params={"factor": 0.2}).status_code == 201
    )


@pytest.mark.parametrize(
    ("kind", "params", "field"),
    [
        ("lower_lr", {}, "params.factor"),
        ("lower_lr", {"factor": 1.5}, "params.factor"),
        ("lower_lr", {"factor": 0.5, "lr": 1}, "params.lr"),
        ("isolate_node", {}, "params.node"),
        ("checkpoint_and_pause", {"when": "now"}, "params.when"),
    ],
)
def test_the_requested_command_is_checked(scene, kind, params, field):
    response = ask(scene, scene.api("oncall"), kind=kind, params=params)
    assert response.status_code == 400 and field in response.json()["fields"]


def test_resume_is_not_an_escalation(scene):
    response = ask(scene, scene.api("oncall"), kind="resume")
    assert response.status_code == 400 and "command.kind" in response.json()["fields"]


def test_no_escalation_on_a_resolved_alert(scene):
    from incidents.alerts.lifecycle import resolve_alert

    alert = raise_alert(scene.job_id, "L2")
    resolve_alert(alert.pk, reason="cleared")
    assert ask(scene, scene.api("oncall"), alert=alert).status_code == 409


def test_approving_for_a_terminated_job_is_409_and_leaves_the_request_pending(scene):
    request = ask(scene, scene.api("oncall")).json()
    Job.objects.filter(pk=scene.job_id).update(status=JobStatus.TERMINATED)
    response = scene.api("manager").post(f"/api/v1/escalations/{request['id']}/approve")
    assert response.status_code == 409
    assert EscalationRequest.objects.get().status == EscalationStatus.PENDING
    entry = AuditEntry.objects.filter(action="approve_escalation").latest("id")
    assert (entry.allowed, entry.outcome_code) == (True, "conflict")


def test_the_list_filters_by_status(scene):
    request = ask(scene, scene.api("oncall")).json()
    viewer = scene.api("viewer")
    assert [r["id"] for r in viewer.get("/api/v1/escalations", status="pending").json()] == [
        request["id"]
    ]
    assert viewer.get("/api/v1/escalations", status="approved").json() == []
    assert viewer.get("/api/v1/escalations", status="bogus").status_code == 400
    assert viewer.get(f"/api/v1/escalations/{request['id']}").json()["id"] == request["id"]


# --- Expiry ---------------------------------------------------------------------------------


def test_an_undecided_request_expires_and_calls_the_next_manager_hook(
    scene, monkeypatch, django_capture_on_commit_callbacks
):
    requested, expired = [], []
    monkeypatch.setattr(escalations, "notify_managers_of_request", requested.append)
    monkeypatch.setattr(escalations, "notify_next_manager", expired.append)
    with django_capture_on_commit_callbacks(execute=True):
        request = ask(scene, scene.api("oncall")).json()
    assert requested == [request["id"]]
    assert expire_escalations(timezone.now()) == []  # not due yet
    later = timezone.now() + timedelta(seconds=escalations.decision_seconds() + 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert expire_escalations(later) == [request["id"]]
    assert expired == [request["id"]]
    assert expire_escalations(later) == []  # once
    assert EscalationRequest.objects.get().status == EscalationStatus.EXPIRED
    assert not Command.objects.exists()  # on_expiry "notify": nothing sent
    note = TimelineEntry.objects.filter(kind="note").latest("id")
    assert note.data["event"] == "escalation_expired" and note.actor_kind == "system"
    late = scene.api("manager").post(f"/api/v1/escalations/{request['id']}/approve")
    assert late.status_code == 409 and "already expired" in late.json()["detail"]


def test_an_expired_auto_l3_request_becomes_the_systems_checkpoint_and_pause(scene):
    request = ask(
        scene, scene.api("oncall"), kind="lower_lr", params={"factor": 0.1}, on_expiry="auto_l3"
    ).json()
    later = timezone.now() + timedelta(seconds=escalations.decision_seconds() + 1)
    assert expire_escalations(later) == [request["id"]]
    command = Command.objects.get()
    assert (command.kind, command.issued_by_kind, command.severity, command.issued_by) == (
        "checkpoint_and_pause",
        "system",
        "L3",
        None,
    )
    assert EscalationRequest.objects.get().command_id == command.pk
    assert [c["kind"] for c in heartbeat(scene)] == ["checkpoint_and_pause"]
    system_row = AuditEntry.objects.get(user=None)
    assert (system_row.action, system_row.allowed, system_row.level) == ("pause_job", True, "L3")
    # The automatic pause is the system's L3 pause: on-call may confirm (e.g. resume) it.
    confirm = scene.api("oncall").post(
        f"/api/v1/jobs/{scene.job_id}/confirm-pause", {"decision": "resume"}
    )
    assert confirm.status_code == 200, confirm.content


def test_auto_l3_sends_nothing_to_a_job_that_is_already_paused(scene):
    ask(scene, scene.api("oncall"), on_expiry="auto_l3")
    Job.objects.filter(pk=scene.job_id).update(status=JobStatus.PAUSED)
    later = timezone.now() + timedelta(seconds=escalations.decision_seconds() + 1)
    assert len(expire_escalations(later)) == 1
    assert not Command.objects.exists()
    assert "already paused" in TimelineEntry.objects.filter(kind="note").latest("id").message


def test_a_request_decided_meanwhile_does_not_expire(scene):
    request = ask(scene, scene.api("oncall")).json()
    approve_escalation(scene.person("manager"), request["id"])
    later = timezone.now() + timedelta(days=1)
    assert expire_escalations(later) == []
    assert EscalationRequest.objects.get().status == EscalationStatus.APPROVED


def test_services_refuse_like_the_api(scene):
    request = ask(scene, scene.api("oncall")).json()
    with pytest.raises(Forbidden):
        approve_escalation(scene.person("viewer"), request["id"])
    approve_escalation(scene.person("manager"), request["id"])
    with pytest.raises(Conflict):
        approve_escalation(scene.person("admin"), request["id"])
    assert Command.objects.count() == 1


def test_the_expiry_task_runs_the_service(scene):
    from breakers.control.tasks import expire_escalations as task

    ask(scene, scene.api("oncall"))
    EscalationRequest.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert task.apply().get() == 1
    assert EscalationRequest.objects.get().status == EscalationStatus.EXPIRED


def test_a_worker_finds_the_expiry_task_by_autodiscovery():
    """Beat sends it by name: a worker must know the name without anybody importing it."""
    code = (
        "import django; django.setup(); from config.celery import app; "
        "app.loader.import_default_modules(); "
        "print('escalations.expire' in app.tasks)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
    )
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr
