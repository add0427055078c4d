"""A person's actions over HTTP: what they send to the job, their state checks (409), the
timeline, authentication (session + CSRF, personal tokens) and team scoping (404)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from breakers.checkpoints import CheckpointReport, record_checkpoint
from breakers.control.acknowledge import acknowledge_command
from breakers.control.commands import issue_command
from breakers.models import Command
from incidents.models import (
    AuditEntry,
    EscalationRequest,
    Incident,
    Job,
    JobStatus,
    OnCallShift,
    PersonalToken,
    TimelineEntry,
)
from tests.support.authz import Api, Scene, make_member, raise_alert

pytestmark = pytest.mark.django_db


def heartbeat_commands(scene: Scene, client: Client | None = None) -> list[dict]:
    response = (client or Client()).post(
        "/api/v1/agent/heartbeat",
        json.dumps({"step": 10, "status": "running"}),
        content_type="application/json",
        headers=scene.agent_headers,
    )
    assert response.status_code == 200, response.content
    return response.json()["commands"]


# --- Pause, confirm, resume, terminate --------------------------------------------------------


def test_one_click_pause_reaches_the_job_with_the_person_and_reason(scene):
    alert = raise_alert(scene.job_id, "L2")
    oncall = scene.api("oncall")
    response = oncall.post(
        f"/api/v1/jobs/{scene.job_id}/pause",
        {"reason": "loss looks wrong", "alert_id": alert.pk},
    )
    assert response.status_code == 202, response.content
    sent = response.json()["command"]
    assert (sent["kind"], sent["reason"], sent["severity"]) == (
        "checkpoint_and_pause",
        "loss looks wrong",
        "L2",
    )
    command = Command.objects.get(pk=sent["id"])
    assert (command.issued_by_kind, command.issued_by, command.alert_id) == (
        "person",
        oncall.user,
        alert.pk,
    )
    assert Job.objects.get(pk=scene.job_id).status == JobStatus.PAUSING
    assert [c["id"] for c in heartbeat_commands(scene)] == [command.pk]
    row = TimelineEntry.objects.get(incident_id=alert.incident_id, kind="command_issued")
    assert (row.actor_kind, row.actor) == ("person", oncall.user)


def test_a_second_pause_while_pausing_is_409_and_sends_nothing(scene):
    oncall = scene.api("oncall")
    assert oncall.post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "a"}).status_code == 202
    again = oncall.post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "b"})
    assert again.status_code == 409
    assert again.json()["error"] == "conflict" and "pausing" in again.json()["detail"]
    assert Command.objects.filter(job_id=scene.job_id).count() == 1


def test_pause_is_one_click_a_blank_reason_is_no_refusal(scene):
    response = scene.api("oncall").post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": ""})
    assert response.status_code == 202, response.content
    assert response.json()["command"]["reason"].startswith("one-click pause by ")


def automatic_l3_pause(scene: Scene) -> Command:
    alert = raise_alert(scene.job_id, "L3")
    return issue_command(
        scene.job_id,
        "checkpoint_and_pause",
        reason="loss is NaN",
        severity="L3",
        alert_id=alert.pk,
        idempotency_key=f"alert:{alert.pk}:L3:checkpoint_and_pause",
    ).command


def test_oncall_rolls_back_an_automatic_l3_pause_to_a_named_checkpoint(scene):
    pause = automatic_l3_pause(scene)
    brake = {"path": "/ck/4500", "sha256": "b" * 64, "step": 4500, "weights_step": 4500}
    acknowledge_command(scene.job_id, pause.pk, status="succeeded", result=brake)
    earlier = record_checkpoint(
        scene.job_id, CheckpointReport(path="/ck/4000", sha256="a" * 64, step=4000)
    )[0]
    oncall = scene.api("oncall")
    listed = oncall.get(f"/api/v1/jobs/{scene.job_id}/checkpoints").json()
    assert [(e["path"], e["reason"]) for e in listed] == [
        ("/ck/4500", "brake"),
        ("/ck/4000", "manual"),
    ]
    response = oncall.post(
        f"/api/v1/jobs/{scene.job_id}/confirm-pause",
        {"decision": "roll_back", "checkpoint": "/ck/4000", "reason": "4500 already diverged"},
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["decision"], body["level"], body["pause_command_id"]) == (
        "roll_back",
        "L3",
        pause.pk,
    )
    assert body["command"]["kind"] == "resume"
    params = {
        "checkpoint": "/ck/4000",
        "sha256": "a" * 64,
        "step": 4000,
        "catalogue_id": earlier.pk,
    }
    assert body["command"]["params"] == params
    assert [(c["kind"], c["params"]) for c in heartbeat_commands(scene)] == [("resume", params)]
    note = TimelineEntry.objects.filter(kind="note", actor=oncall.user).get()
    assert note.data["decision"] == "roll_back" and note.data["checkpoint"] == "/ck/4000"


def test_a_roll_back_the_job_refuses_shows_why_and_can_be_confirmed_again(scene):
    pause = automatic_l3_pause(scene)
    brake = {"path": "/ck/4500", "sha256": "b" * 64, "step": 4500, "weights_step": 4500}
    acknowledge_command(scene.job_id, pause.pk, status="succeeded", result=brake)
    record_checkpoint(scene.job_id, CheckpointReport(path="/ck/4000", sha256="a" * 64, step=4000))
    oncall = scene.api("oncall")
    path = f"/api/v1/jobs/{scene.job_id}/confirm-pause"
    first = oncall.post(path, {"decision": "roll_back", "checkpoint": "/ck/4000"}).json()
    why = f"checkpoint /ck/4000 has sha256 {'c' * 64}, not {'a' * 64}"
    acknowledge_command(scene.job_id, first["command"]["id"], status="failed", error=why)
    # The API, the job page and the timeline say why; the job stays paused.
    detail = oncall.get(f"/api/v1/jobs/{scene.job_id}").json()
    assert detail["status"] == "paused"
    refused = detail["pause"]["confirmation"]
    assert (refused["decision"], refused["refused"], refused["error"]) == ("roll_back", True, why)
    oncall.client.force_login(oncall.user)
    page = oncall.client.get(f"/jobs/{scene.job_id}/").content.decode()
    assert 'id="confirmation-refused"' in page and why in page and 'id="awaiting"' in page
    note = TimelineEntry.objects.get(kind="note", data__event="roll_back_refused")
    assert why in note.message and "stays paused" in note.message
    # A new decision replaces the refused one and sends its own resume.
    again = oncall.post(path, {"decision": "resume", "reason": "keep the brake's checkpoint"})
    assert again.status_code == 200, again.content
    assert again.json()["command"]["id"] != first["command"]["id"]
    assert [c["kind"] for c in heartbeat_commands(scene)] == ["resume"]
    confirmed = oncall.get(f"/api/v1/jobs/{scene.job_id}").json()["pause"]["confirmation"]
    assert (confirmed["decision"], confirmed["refused"]) == ("resume", False)
    assert oncall.post(path, {"decision": "keep_paused"}).status_code == 409


def test_a_roll_back_names_only_a_checkpoint_of_the_catalogue(scene):
    automatic_l3_pause(scene)
    response = scene.api("oncall").post(
        f"/api/v1/jobs/{scene.job_id}/confirm-pause",
        {"decision": "roll_back", "checkpoint": "/nonexistent/ckpt.pt"},
    )
    assert response.status_code == 400
    assert "catalogue" in response.json()["fields"]["checkpoint"]
    assert not Command.objects.filter(job_id=scene.job_id, kind="resume").exists()


def test_keep_paused_sends_nothing_and_a_second_confirmation_is_409(scene):
    automatic_l3_pause(scene)
    first, second = scene.api("oncall"), scene.api("manager")
    path = f"/api/v1/jobs/{scene.job_id}/confirm-pause"
    assert first.post(path, {"decision": "keep_paused"}).status_code == 200
    response = second.post(path, {"decision": "resume"})
    assert response.status_code == 409
    assert first.user.username in response.json()["detail"]
    assert not Command.objects.filter(job_id=scene.job_id, kind="resume").exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"decision": "roll_back"}, "checkpoint"),
        ({"decision": "resume", "checkpoint": "/ck/1"}, "checkpoint"),
        ({"decision": "maybe"}, "decision"),
    ],
)
def test_confirmation_bodies_are_checked(scene, body, field):
    automatic_l3_pause(scene)
    response = scene.api("oncall").post(f"/api/v1/jobs/{scene.job_id}/confirm-pause", body)
    assert response.status_code == 400 and field in response.json()["fields"]


def test_there_is_nothing_to_confirm_on_a_running_job(scene):
    response = scene.api("manager").post(
        f"/api/v1/jobs/{scene.job_id}/confirm-pause", {"decision": "keep_paused"}
    )
    assert response.status_code == 409


def test_manager_resumes_a_paused_job_once(scene):
    Job.objects.filter(pk=scene.job_id).update(status=JobStatus.PAUSED)
    manager = scene.api("manager")
    path = f"/api/v1/jobs/{scene.job_id}/resume"
    assert manager.post(path, {"reason": "fixed the data"}).status_code == 202
    assert manager.post(path, {"reason": "again"}).status_code == 409
    assert Command.objects.filter(job_id=scene.job_id, kind="resume").count() == 1


def test_resuming_a_running_job_is_409(scene):
    response = scene.api("manager").post(f"/api/v1/jobs/{scene.job_id}/resume", {"reason": "x"})
    assert response.status_code == 409


def test_terminate_then_nothing_more(scene):
    manager = scene.api("manager")
    path = f"/api/v1/jobs/{scene.job_id}/terminate"
    assert manager.post(path, {"reason": "hardware"}).status_code == 202
    assert manager.post(path, {"reason": "again"}).status_code == 409
    command = Command.objects.get(job_id=scene.job_id, kind="terminate")
    acknowledge_command(scene.job_id, command.pk, status="succeeded")
    assert manager.post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "x"}).status_code == 409


def test_mitigation_params_are_checked_after_the_authority(scene):
    path = f"/api/v1/jobs/{scene.job_id}/mitigate"
    bad = {"kind": "lower_lr", "params": {"factor": 3}, "reason": "x"}
    assert scene.api("oncall").post(path, bad).status_code == 403
    response = scene.api("manager").post(path, bad)
    assert response.status_code == 400 and "params.factor" in response.json()["fields"]


# --- Authentication ---------------------------------------------------------------------------


def test_session_writes_need_the_csrf_token(scene):
    user = scene.person("oncall")
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    path = f"/api/v1/jobs/{scene.job_id}/pause"
    refused = browser.post(path, {"reason": "x"}, content_type="application/json")
    assert refused.status_code == 403 and "CSRF" in refused.json()["detail"]
    assert not Command.objects.exists()
    browser.get("/login/")  # the login page sets the csrftoken cookie
    token = browser.cookies["csrftoken"].value
    allowed = browser.post(
        path, {"reason": "x"}, content_type="application/json", headers={"X-CSRFToken": token}
    )
    assert allowed.status_code == 202, allowed.content
    assert AuditEntry.objects.get(allowed=True).via == "session"


@pytest.mark.parametrize("scheme", ["Token", "Bearer"])
def test_personal_tokens_need_no_csrf(scene, scheme):
    user = scene.person("oncall")
    raw = PersonalToken.issue(user, "script")[1]
    response = Client(enforce_csrf_checks=True).post(
        f"/api/v1/jobs/{scene.job_id}/pause",
        {"reason": "from a script"},
        content_type="application/json",
        headers={"Authorization": f"{scheme} {raw}"},
    )
    assert response.status_code == 202, response.content
    assert Command.objects.get().issued_by == user
    assert AuditEntry.objects.get(allowed=True).via == "token"
    assert PersonalToken.objects.get().last_used_at is not None


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "unauthenticated"),
        ("Token bkp_not-a-real-token", "unknown_token"),
        ("agent", "unauthenticated"),  # a job's token is no person's
    ],
)
def test_no_or_wrong_credentials_are_401(scene, header, code):
    headers = {}
    if header == "agent":
        headers = scene.agent_headers
    elif header:
        headers = {"Authorization": header}
    response = Client().post(
        f"/api/v1/jobs/{scene.job_id}/pause",
        {"reason": "x"},
        content_type="application/json",
        headers=headers,
    )
    assert response.status_code == 401
    assert response.json()["error"] == code
    assert not Command.objects.exists()


def test_a_revoked_token_stops_working(scene):
    api = scene.api("oncall")
    token = PersonalToken.objects.get(user=api.user)
    assert api.get(f"/api/v1/jobs/{scene.job_id}").status_code == 200
    assert api.delete(f"/api/v1/tokens/{token.pk}").status_code == 200
    response = api.get(f"/api/v1/jobs/{scene.job_id}")
    assert response.status_code == 401 and response.json()["error"] == "revoked_token"


def test_nobody_sees_or_revokes_another_persons_token(scene):
    owner, other = scene.api("admin"), Api(scene.extra("second-admin", "admin"))
    token = PersonalToken.objects.get(user=owner.user)
    assert [t["id"] for t in other.get("/api/v1/tokens").json()] == [
        PersonalToken.objects.get(user=other.user).pk
    ]
    assert other.delete(f"/api/v1/tokens/{token.pk}").status_code == 404
    assert PersonalToken.objects.get(pk=token.pk).revoked_at is None


def test_tokens_are_created_from_a_session_and_shown_once(scene):
    user = scene.person("viewer")
    browser = Client()
    browser.force_login(user)
    created = browser.post("/api/v1/tokens", {"name": "ci"}, content_type="application/json")
    assert created.status_code == 201
    raw = created.json()["token"]
    assert raw.startswith("bkp_") and not PersonalToken.objects.filter(token_hash=raw).exists()
    listed = browser.get("/api/v1/tokens").json()
    assert [(t["name"], t["prefix"]) for t in listed] == [("ci", raw[:12])]
    assert "token" not in listed[0]
    by_token = Api(user).post("/api/v1/tokens", {"name": "more"})
    assert by_token.status_code == 403


def test_create_token_command_prints_a_working_token(scene, capsys):
    user = scene.person("viewer")
    call_command("create_token", "--user", user.username, "--name", "nightly")
    raw = capsys.readouterr().out.strip().splitlines()[-1]
    response = Client().get("/api/v1/alerts", headers={"Authorization": f"Token {raw}"})
    assert response.status_code == 200
    assert AuditEntry.objects.get(action="issue_token").via == "command"


# --- Team scoping: another team's ids look like missing ones -----------------------------------


def other_teams_objects(scene: Scene) -> dict[str, int]:
    alert = raise_alert(scene.job_id, "L2")
    requester = scene.person("oncall")
    now = timezone.now()
    escalation = EscalationRequest.objects.create(
        job_id=scene.job_id,
        alert=alert,
        level="L2",
        command_kind="checkpoint_and_pause",
        reason="x",
        requested_by=requester,
        requested_at=now,
        expires_at=now + timedelta(minutes=5),
    )
    shift = OnCallShift.objects.create(
        team=scene.team, user=requester, starts_at=now, ends_at=now + timedelta(hours=1)
    )
    return {
        "job": scene.job_id,
        "alert": alert.pk,
        "escalation": escalation.pk,
        "team": scene.team.pk,
        "shift": shift.pk,
    }


ENDPOINTS = [
    ("get", "/api/v1/jobs/{job}", None),
    ("post", "/api/v1/jobs/{job}/pause", {"reason": "x"}),
    ("post", "/api/v1/jobs/{job}/resume", {"reason": "x"}),
    ("post", "/api/v1/jobs/{job}/terminate", {"reason": "x"}),
    ("post", "/api/v1/jobs/{job}/confirm-pause", {"decision": "keep_paused"}),
    ("post", "/api/v1/jobs/{job}/mitigate", {"kind": "pause_data", "reason": "x"}),
    ("post", "/api/v1/jobs/{job}/isolate-node", {"node": "n1", "reason": "x"}),
    ("get", "/api/v1/alerts/{alert}", None),
    ("post", "/api/v1/alerts/{alert}/acknowledge", {}),
    ("get", "/api/v1/escalations/{escalation}", None),
    (
        "post",
        "/api/v1/escalations",
        {"job_id": "{job}", "command": {"kind": "checkpoint_and_pause"}, "reason": "x"},
    ),
    ("post", "/api/v1/escalations/{escalation}/approve", {}),
    ("post", "/api/v1/escalations/{escalation}/reject", {}),
    ("get", "/api/v1/teams/{team}/shifts", None),
    (
        "post",
        "/api/v1/teams/{team}/shifts",
        {"user_id": 1, "starts_at": "2026-01-01T00:00Z", "ends_at": "2026-01-02T00:00Z"},
    ),
    ("delete", "/api/v1/teams/{team}/shifts/{shift}", None),
    ("get", "/api/v1/teams/{team}/oncall", None),
    ("get", "/api/v1/audit?team={team}", None),
]


@pytest.mark.parametrize(
    ("method", "path", "body"), ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS]
)
def test_another_teams_objects_are_404_for_every_endpoint(scene, method, path, body):
    ids = other_teams_objects(scene)
    stranger = scene.api(None)  # an admin, but of another team
    path = path.format(**ids)
    if body is not None:
        body = json.loads(json.dumps(body).replace('"{job}"', str(ids["job"])))
        response = getattr(stranger, method)(path, body)
    else:
        response = getattr(stranger, method)(path)
    assert response.status_code == 404, response.content
    assert response.json()["error"] == "not_found"
    assert not Command.objects.exists()
    assert EscalationRequest.objects.get().status == "pending"


@pytest.mark.parametrize("path", ["/api/v1/alerts", "/api/v1/escalations", "/api/v1/audit"])
def test_lists_show_only_my_teams(scene, path):
    other_teams_objects(scene)
    scene.api("manager").post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "x"})
    assert scene.api("admin").get(path).json() != []
    assert scene.api(None).get(path).json() == []


def test_an_existing_and_a_missing_id_look_the_same(scene):
    stranger = scene.api(None)
    hidden = stranger.post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "x"}).json()
    missing = stranger.post("/api/v1/jobs/999999/pause", {"reason": "x"}).json()
    assert hidden["error"] == missing["error"] == "not_found"
    assert hidden["detail"].replace(str(scene.job_id), "N") == missing["detail"].replace(
        "999999", "N"
    )


def test_the_openapi_schema_documents_the_actions(client):
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    pause = schema["paths"]["/api/v1/jobs/{id}/pause"]["post"]
    assert set(pause["responses"]) >= {"202", "400", "401", "403", "404", "409"}
    for path in [
        "/api/v1/alerts",
        "/api/v1/alerts/{id}/acknowledge",
        "/api/v1/escalations",
        "/api/v1/escalations/{id}/approve",
        "/api/v1/escalations/{id}/reject",
        "/api/v1/audit",
        "/api/v1/teams/{id}/shifts",
        "/api/v1/tokens",
        "/api/v1/jobs/{id}/confirm-pause",
    ]:
        assert path in schema["paths"], path
    assert "personalToken" in schema["components"]["securitySchemes"]


def test_make_member_helper_gives_roles_only_in_that_team(scene):
    # Guard for the fixtures themselves: the stranger has no membership in the scene's team.
    stranger = scene.person(None)
    assert not stranger.memberships.filter(team=scene.team).exists()
    assert make_member(scene.team, "viewer").memberships.get().role == "viewer"


@pytest.mark.parametrize(
    ("target", "descendants_clean"),
    [("/ck/4000", True), ("/ck/4600", False)],
    ids=["to-a-clean-checkpoint", "to-one-after-the-anomaly"],
)
def test_checkpoints_saved_after_a_roll_back_descend_from_what_it_restored(
    scene, target, descendants_clean
):
    """The run trains on from the restored step (4001…): a checkpoint it saves since is clean
    exactly when what it restored was, though its step is past the anomaly's."""
    pause = automatic_l3_pause(scene)
    Incident.objects.filter(job_id=scene.job_id).update(first_step=4550)
    brake = {"path": "/ck/4600", "sha256": "b" * 64, "step": 4600, "weights_step": 4600}
    acknowledge_command(scene.job_id, pause.pk, status="succeeded", result=brake)
    record_checkpoint(scene.job_id, CheckpointReport(path="/ck/4000", sha256="a" * 64, step=4000))
    oncall = scene.api("oncall")
    decided = oncall.post(
        f"/api/v1/jobs/{scene.job_id}/confirm-pause",
        {"decision": "roll_back", "checkpoint": target},
    ).json()
    acknowledge_command(scene.job_id, decided["command"]["id"], status="succeeded", result={})
    later = CheckpointReport(path="/ck/4800-after", sha256="c" * 64, step=4800, weights_step=4800)
    record_checkpoint(scene.job_id, later)
    listed = oncall.get(f"/api/v1/jobs/{scene.job_id}/checkpoints").json()
    clean = {e["path"]: e["clean"] for e in listed}
    assert clean == {"/ck/4800-after": descendants_clean, "/ck/4600": False, "/ck/4000": True}
    assert next(e["path"] for e in listed if e.get("preselected")) == (
        "/ck/4800-after" if descendants_clean else "/ck/4000"
    )


def test_asking_a_manager_to_confirm_is_for_whoever_may_pause_and_hides_other_teams_jobs(scene):
    path = f"/api/v1/jobs/{scene.job_id}/ask-confirmation"
    stranger = scene.api(None).post(path, {"note": "please"})
    assert stranger.status_code == 404, stranger.content  # no 500: the same 404 as no such job
    refused = AuditEntry.objects.get(action="ask_confirmation", allowed=False)
    assert (refused.user, refused.team_id) == (scene.person(None), scene.team.pk)
    assert refused.reason == "You have no role in this team."
    assert scene.api("viewer").post(path, {}).status_code == 403
    assert scene.api("oncall").post(path, {}).status_code == 409  # running: nothing to confirm
    Job.objects.filter(pk=scene.job_id).update(status=JobStatus.PAUSED)
    scene.person("manager")
    asked = scene.api("oncall").post(path, {"note": "NaN at 48,200, keep it paused?"})
    assert asked.status_code == 202, asked.content
