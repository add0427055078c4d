"""The job's one state machine: every path that pauses, resumes or terminates a job — a person,
an approved escalation, a breaker's alert, an expired escalation — is judged by the same table,
so a paused job is never paused a second time and a person's pause is ended only by whoever
the authority says."""

from __future__ import annotations

import pytest

from breakers.control.acknowledge import acknowledge_command
from breakers.control.braking import brake_for_alert
from breakers.control.job_state import ACCEPTED_IN, refusal
from breakers.models import Checkpoint, Command, CommandKind
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.models import (
    FINAL_JOB_STATUSES,
    JOB_EVENTS,
    JOB_TRANSITIONS,
    SYSTEM_COMMAND_REFUSED,
    EscalationRequest,
    Job,
    JobStatus,
    TimelineEntry,
    job_statuses_for,
)
from incidents.notifications.messages import alert_message
from tests.support.authz import T0, Api, Scene, raise_alert

S = JobStatus


def test_the_transition_table_is_derived_from_the_events_and_is_the_documented_one():
    assert {
        S.PENDING: {S.RUNNING, S.PAUSING, S.TERMINATED, S.FINISHED},
        S.RUNNING: {S.PAUSING, S.PAUSED, S.TERMINATED, S.FINISHED},
        S.PAUSING: {S.PAUSED, S.RUNNING, S.TERMINATED},
        S.PAUSED: {S.RUNNING, S.TERMINATED},
        S.TERMINATED: set(),
        S.FINISHED: set(),
    } == JOB_TRANSITIONS
    assert FINAL_JOB_STATUSES == (S.TERMINATED, S.FINISHED)
    for event, moves in JOB_EVENTS.items():
        assert len(set(moves.values())) == 1, f"{event} has one target status"


@pytest.mark.parametrize("kind", CommandKind.values)
@pytest.mark.parametrize("status", S.values)
def test_a_command_is_taken_exactly_in_the_statuses_its_event_starts_from(kind, status, request):
    expected = {
        CommandKind.CHECKPOINT_AND_PAUSE: job_statuses_for("pause"),
        CommandKind.RESUME: job_statuses_for("resume"),
        CommandKind.TERMINATE: job_statuses_for("terminate"),
        CommandKind.LOWER_LR: (S.PENDING, S.RUNNING),
        CommandKind.PAUSE_DATA: (S.PENDING, S.RUNNING),
        CommandKind.ISOLATE_NODE: (S.PENDING, S.RUNNING, S.PAUSING, S.PAUSED),
        CommandKind.INJECT_FAULT: (S.PENDING, S.RUNNING),
    }[kind]
    assert ACCEPTED_IN[kind] == expected
    # Faults go to drill sandboxes only (tests/breakers/drills: an ordinary job refuses them
    # always).
    job = Job(pk=None, name="j", status=status, drill_sandbox=kind == CommandKind.INJECT_FAULT)
    if kind in (CommandKind.RESUME, CommandKind.TERMINATE) and status in expected:
        request.getfixturevalue("db")  # one at a time: it asks for an open one (there is none)
    assert (refusal(job, kind) is None) == (status in expected)


def nan_signal(rule_key: str = "loss-nan") -> AlertSignal:
    return AlertSignal(
        rule_key=rule_key,
        rule_name="NaN/Inf in loss or gradients",
        layer="stability",
        severity="L3",
        metric="loss",
        node="",
        value=float("nan"),
        threshold=None,
        description="loss is NaN",
        step=200,
        time=T0,
        first_step=200,
        first_time=T0,
        action="checkpoint_and_pause",
    )


def paused_by_the_manager(scene: Scene) -> Command:
    manager = scene.api("manager")
    response = manager.post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "odd loss"})
    assert response.status_code == 202, response.content
    pause = Command.objects.get(pk=response.json()["command"]["id"])
    acknowledge_command(scene.job_id, pause.pk, status="succeeded", result={"path": "/ck/1"})
    assert Job.objects.get(pk=scene.job_id).status == S.PAUSED
    return pause


@pytest.mark.django_db
def test_a_new_l3_alert_does_not_pause_a_paused_job_again_and_oncall_cannot_end_the_pause(
    scene,
):
    raise_alert(scene.job_id, "L1")  # the incident the manager's pause belongs to
    pause = paused_by_the_manager(scene)
    alert = raise_or_update_alert(scene.job_id, nan_signal()).alert
    assert brake_for_alert(alert) == []
    pauses = Command.objects.filter(job_id=scene.job_id, kind=CommandKind.CHECKPOINT_AND_PAUSE)
    assert list(pauses) == [pause]
    note = TimelineEntry.objects.filter(data__event=SYSTEM_COMMAND_REFUSED).get()
    assert note.message.startswith("No automatic pause: job ") and "already paused" in note.message
    # The page says what happened, not what the rule would have done ("— paused").
    first = alert_message(alert).first_line
    assert "— no automatic pause: job " in first and "already paused" in first, first
    # The pause is still the manager's: on-call may not end it, whatever arrived later.
    path = f"/api/v1/jobs/{scene.job_id}/confirm-pause"
    refused = scene.api("oncall").post(path, {"decision": "resume"})
    assert refused.status_code == 403, refused.content
    assert "manager" in refused.json()["detail"]
    assert scene.api("manager").post(path, {"decision": "resume"}).status_code == 200


@pytest.mark.django_db
def test_an_escalation_approved_after_the_job_was_paused_is_409_and_sends_nothing(scene):
    alert = raise_alert(scene.job_id, "L1")
    asked = scene.api("oncall").post(
        "/api/v1/escalations",
        {
            "job_id": scene.job_id,
            "alert_id": alert.pk,
            "command": {"kind": "checkpoint_and_pause", "params": {}},
            "reason": "loss drifting up",
        },
    )
    assert asked.status_code == 201, asked.content
    pause = paused_by_the_manager(scene)
    approver = Api(scene.extra("second-manager", "manager"))
    answer = approver.post(f"/api/v1/escalations/{asked.json()['id']}/approve")
    assert answer.status_code == 409, answer.content
    assert "paused" in answer.json()["detail"]
    assert list(Command.objects.filter(kind=CommandKind.CHECKPOINT_AND_PAUSE)) == [pause]
    assert EscalationRequest.objects.get().status == "pending"  # nothing half-written
    assert Job.objects.get(pk=scene.job_id).status == S.PAUSED


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["lower_lr", "pause_data"])
def test_an_escalation_that_could_never_be_carried_out_is_refused_when_requested(scene, kind):
    """On a paused job a manager's approval of lower_lr would fail: the request is refused at
    once, saying why, instead of waiting for that approval until it expires."""
    alert = raise_alert(scene.job_id, "L1")
    paused_by_the_manager(scene)
    params = {"factor": 0.5} if kind == "lower_lr" else {}
    asked = scene.api("oncall").post(
        "/api/v1/escalations",
        {
            "job_id": scene.job_id,
            "alert_id": alert.pk,
            "command": {"kind": kind, "params": params},
            "reason": "loss drifting up",
        },
    )
    assert asked.status_code == 409, asked.content
    assert "paused: it is not training" in asked.json()["detail"]
    assert not EscalationRequest.objects.exists()  # nothing half-written, nothing to approve


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("result", "status"), [({"step": 7, "paused": True}, S.PAUSED), ({"step": 7}, S.PAUSING)]
)
def test_a_failed_save_that_still_holds_leaves_the_job_paused(scene, result, status):
    """The SDK holds without a checkpoint when its save fails (disk full): the failed ack
    says ``paused``, and the job is paused, not left "pausing" for ever (a fire drill found)."""
    manager = scene.api("manager")
    response = manager.post(f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "odd loss"})
    assert response.status_code == 202, response.content
    pause = Command.objects.get(pk=response.json()["command"]["id"])
    error = "checkpoint failed (OSError: [Errno 28] No space left on device)"
    acknowledge_command(scene.job_id, pause.pk, status="failed", result=result, error=error)
    assert Job.objects.get(pk=scene.job_id).status == status
    assert not Checkpoint.objects.filter(command_id=pause.pk).exists()
