"""Automatic recovery on the console, without a training process: the verdict recorded before
the roll back is requested, the budget and history, hardware signals, a person taking over
(by the button, the API or any command of theirs), the incident page and the review.

The job's side is played by acknowledging its commands as the agent would; the real training
process is tests/brakeline/test_integration_live_recovery.py's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from breakers.checkpoints import CheckpointReport, record_checkpoint
from breakers.control.acknowledge import acknowledge_command
from breakers.control.braking import system_command
from breakers.control.commands import issue_command
from breakers.control.job_actions import confirm_pause, pause_job
from breakers.detection import rulesets
from breakers.models import Command, CommandKind
from breakers.recovery.service import consider_recovery
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.heartbeats import record_heartbeat
from incidents.models import (
    ActorKind,
    Alert,
    Incident,
    Job,
    Recovery,
    RecoveryStatus,
    RecoveryVerdict,
    Team,
    TimelineEntry,
)
from incidents.recoveries import take_over
from tests.support.authz import Api, make_member

pytestmark = pytest.mark.django_db

NAN = "non-finite-loss-or-gradients"
NODE = "gpu-a"
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _policy(job_id: int, recovery: str = "recover", budget: int = 3) -> None:
    team = Job.objects.get(pk=job_id).team
    admin = make_member(team, "admin", prefix="admin")
    change = {"recovery": recovery, "recovery_budget": budget}
    rulesets.change_rules(
        admin, team.pk, "policy", [{"op": "update", "key": NAN, "fields": change}]
    )


def _signal(
    rule_key: str, step: int, *, severity: str = "L3", action: str = "checkpoint_and_pause"
):
    return AlertSignal(
        rule_key=rule_key,
        rule_name=rule_key,
        layer="stability" if rule_key == NAN else "health",
        severity=severity,
        metric="loss",
        node=NODE,
        value=float("nan"),
        threshold=None,
        description=f"{rule_key} at step {step}",
        step=step,
        time=T0 + timedelta(seconds=step),
        first_step=step,
        first_time=T0 + timedelta(seconds=step),
        action=action,
    )


def _brake(job_id: int, step: int, *, weights_step: int | None = None) -> Command:
    """The rule's alert, the system's L3 pause, and the job's confirmation of its checkpoint."""
    record_heartbeat(job_id, step=step, status="running", hostname=NODE, rank=0, world_size=1)
    alert = raise_or_update_alert(job_id, _signal(NAN, step)).alert
    pause = system_command(
        job_id,
        CommandKind.CHECKPOINT_AND_PAUSE,
        level="L3",
        reason="NaN",
        key=f"test:{alert.pk}",
        alert_id=alert.pk,
    )
    assert pause is not None
    result = {
        "path": f"/ck/step-{step:08d}.pt",
        "sha256": f"{step % 16:x}" * 64,
        "step": step,
        "weights_step": step - 1 if weights_step is None else weights_step,
        "bytes": 100,
    }
    return acknowledge_command(job_id, pause.pk, status="succeeded", result=result)


def _roll_back_done(recovery: Recovery) -> None:
    resume = Command.objects.get(pk=recovery.resume_command_id)
    restored = {"restored_step": resume.params["step"], "sha256": resume.params["sha256"]}
    acknowledge_command(
        recovery.job_id, resume.pk, status="succeeded", result={"rolled_back": True, **restored}
    )


def _events(incident_id: int) -> list[str]:
    rows = TimelineEntry.objects.filter(incident_id=incident_id).order_by("pk")
    return [row.data.get("event") or row.kind for row in rows]


def test_a_recover_verdict_is_recorded_before_the_system_rolls_back(agent):
    _policy(agent.job_id)
    pause = _brake(agent.job_id, 30)
    recovery = consider_recovery(pause.pk)
    assert recovery is not None and recovery.verdict == RecoveryVerdict.RECOVER
    assert recovery.status == RecoveryStatus.ROLLING_BACK
    assert (recovery.rank, recovery.node, recovery.checkpoint_step) == (0, NODE, 30)
    assert recovery.reasons[0] == f"rule {NAN} at step 30, rank 0 on {NODE}"
    resume = Command.objects.get(pk=recovery.resume_command_id)
    assert resume.kind == CommandKind.RESUME and resume.issued_by_kind == ActorKind.SYSTEM
    assert (
        resume.params["catalogue_id"] == recovery.checkpoint_id
        and "skip_steps" not in resume.params
    )
    events = _events(recovery.incident_id)
    verdict_at = events.index("recovery_verdict")
    assert verdict_at < events.index("command_issued", verdict_at)
    assert events.index("command_issued", verdict_at) < events.index("recovery_roll_back_requested")
    # Idempotent: the task redelivered finds the verdict and sends nothing again.
    assert consider_recovery(pause.pk).pk == recovery.pk
    assert Command.objects.filter(kind=CommandKind.RESUME).count() == 1
    _roll_back_done(recovery)
    recovery.refresh_from_db()
    assert recovery.status == RecoveryStatus.RECOVERED and recovery.finished_at is not None
    assert _events(recovery.incident_id)[-1] == "recovery_recovered"


def test_a_brake_checkpoint_after_the_anomaly_rolls_back_further_and_skips(agent):
    """Without the guard the brake's checkpoint holds the bad update: the last clean one is an
    earlier checkpoint, and the window's batches after it are skipped."""
    _policy(agent.job_id)
    record_heartbeat(agent.job_id, step=28, status="running", hostname=NODE, rank=0, world_size=1)
    record_checkpoint(
        agent.job_id, CheckpointReport("/ck/step-28.pt", "c" * 64, 28, weights_step=28)
    )
    pause = _brake(agent.job_id, 30, weights_step=30)
    Incident.objects.filter(job_id=agent.job_id).update(first_step=29)
    Alert.objects.filter(job_id=agent.job_id).update(first_step=29)
    recovery = consider_recovery(pause.pk)
    assert recovery.verdict == RecoveryVerdict.RECOVER, recovery.reasons
    assert recovery.checkpoint_step == 28 and recovery.skip_steps == [29, 30]
    resume = Command.objects.get(pk=recovery.resume_command_id)
    assert resume.params["skip_steps"] == [29, 30] and resume.params["step"] == 28


def test_a_rule_that_holds_records_nothing_and_waits_for_a_person(agent):
    pause = _brake(agent.job_id, 30)
    assert consider_recovery(pause.pk) is None
    assert not Recovery.objects.exists()
    assert not Command.objects.filter(kind=CommandKind.RESUME).exists()
    assert Job.objects.get(pk=agent.job_id).status == "paused"


def test_a_hardware_signal_on_the_node_isolates_and_pages_instead(agent):
    _policy(agent.job_id)
    raise_or_update_alert(agent.job_id, _signal("dcgm-xid", 29, severity="L2", action="none"))
    pause = _brake(agent.job_id, 30)
    recovery = consider_recovery(pause.pk)
    assert recovery.verdict == RecoveryVerdict.ISOLATE_AND_PAGE
    assert recovery.status == RecoveryStatus.HELD
    assert any(f"dcgm-xid on {NODE}" in reason for reason in recovery.reasons)
    assert not Command.objects.filter(kind=CommandKind.RESUME).exists()
    assert _events(recovery.incident_id)[-1] == "recovery_held"


def test_the_budget_per_hour_stops_the_next_recovery(agent):
    _policy(agent.job_id, budget=1)
    first = consider_recovery(_brake(agent.job_id, 30).pk)
    _roll_back_done(first)
    second = consider_recovery(_brake(agent.job_id, 80).pk)  # another window, with progress
    assert second.verdict == RecoveryVerdict.STOP_AND_PAGE
    assert any("budget spent: 1 automatic recoveries" in reason for reason in second.reasons)


def test_taking_over_first_makes_the_verdict_hold(agent):
    _policy(agent.job_id)
    pause = _brake(agent.job_id, 30)
    oncall = make_member(Job.objects.get(pk=agent.job_id).team, "oncall")
    incident = Incident.objects.get(job_id=agent.job_id)
    take_over(oncall, incident.pk)
    recovery = consider_recovery(pause.pk)
    assert recovery.verdict == RecoveryVerdict.HOLD
    assert any(f"{oncall} took over" in reason for reason in recovery.reasons)
    assert not Command.objects.filter(kind=CommandKind.RESUME).exists()


def test_a_person_confirming_the_pause_first_keeps_the_machine_out(agent):
    _policy(agent.job_id)
    pause = _brake(agent.job_id, 30)
    oncall = make_member(Job.objects.get(pk=agent.job_id).team, "oncall")
    confirm_pause(oncall, agent.job_id, decision="keep_paused", reason="looking at the data")
    recovery = consider_recovery(pause.pk)
    assert recovery.verdict == RecoveryVerdict.HOLD
    assert any(f"{oncall} confirmed pause #{pause.pk}" in r for r in recovery.reasons)
    assert not Command.objects.filter(kind=CommandKind.RESUME).exists()


def test_a_persons_command_takes_over_a_recovery_under_way(agent):
    _policy(agent.job_id)
    recovery = consider_recovery(_brake(agent.job_id, 30).pk)
    _roll_back_done(recovery)
    oncall = make_member(Job.objects.get(pk=agent.job_id).team, "oncall")
    pause_job(oncall, agent.job_id, reason="I will look at it myself")
    incident = Incident.objects.get(pk=recovery.incident_id)
    assert incident.taken_over_by == oncall and "recovery_taken_over" in _events(incident.pk)
    acknowledge_command(
        agent.job_id,
        Command.objects.filter(kind=CommandKind.CHECKPOINT_AND_PAUSE).latest("pk").pk,
        status="succeeded",
        result={"step": 41},
    )
    later = consider_recovery(_brake_again(agent.job_id, 60).pk)
    assert later.verdict == RecoveryVerdict.HOLD


def _brake_again(job_id: int, step: int) -> Command:
    """A second brake of the same incident on a paused-then-resumed job."""
    resume = issue_command(job_id, CommandKind.RESUME, reason="go on").command
    acknowledge_command(job_id, resume.pk, status="succeeded", result={"step": step - 1})
    return _brake(job_id, step)


def test_the_take_over_api_and_the_pages(agent, client):
    _policy(agent.job_id)
    recovery = consider_recovery(_brake(agent.job_id, 30).pk)
    team = Job.objects.get(pk=agent.job_id).team
    url = f"/api/v1/incidents/{recovery.incident_id}"
    viewer, oncall = make_member(team, "viewer"), make_member(team, "oncall")
    outsider = make_member(Team.objects.create(name="other"), "oncall")
    assert Api(outsider).post(f"{url}/take-over", {}).status_code == 404
    assert Api(outsider).get(f"{url}/recoveries").status_code == 404
    assert Api(oncall).post("/api/v1/incidents/999999/take-over", {}).status_code == 404
    assert Api(viewer).post(f"{url}/take-over", {}).status_code == 403
    listed = Api(viewer).get(f"{url}/recoveries").json()
    assert listed["taken_over_by"] is None and listed["recoveries"][0]["verdict"] == "recover"
    client.force_login(oncall)
    page = client.get(f"/incidents/{recovery.incident_id}/").content.decode()
    assert (
        "Automatic recovery" in page and "Take over" in page and "first time for this cause" in page
    )
    job_page = client.get(f"/jobs/{agent.job_id}/").content.decode()
    assert "Automatic recovery: <b>Recover: roll back, skip, resume</b>" in job_page
    assert "Take over" in job_page
    answer = Api(oncall).post(f"{url}/take-over", {})
    assert answer.status_code == 200 and answer.json()["taken_over_by"] == oncall.get_username()
    assert answer.json()["recoveries"][0]["status"] == "taken_over"
    twice = Api(oncall).post(f"{url}/take-over", {"junk": 1})  # a body is ignored
    assert twice.status_code == 200  # twice: no change
    assert _events(recovery.incident_id).count("recovery_taken_over") == 1
    page = client.get(f"/incidents/{recovery.incident_id}/").content.decode()
    assert "Take over</button>" not in page and "Taken over by" in page
    review = client.get(f"/incidents/{recovery.incident_id}/review/").content.decode()
    assert "Automatic recovery: the verdicts" in review and "roll back to the clean" in review
    markdown = Api(viewer).get(f"{url}/review.md").content.decode()
    assert "## Automatic recovery" in markdown and "| recover | taken_over |" in markdown
