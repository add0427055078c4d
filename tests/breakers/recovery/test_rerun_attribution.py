"""Re-run to attribute, on the console: the brake's acknowledgement says what re-running the
refused step found (``result.rerun``), checked field by field; the timeline flags the batch or
the node whatever the rule's policy; the verdict isolates the node of a transient fault and
recovers past a batch that repeats. The job's side is played by acknowledging as the agent
would; the real training processes are tests/brakeline/test_integration_live_rerun.py's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from breakers.control.acknowledge import acknowledge_command
from breakers.control.braking import system_command
from breakers.control.commands import issue_command
from breakers.detection import rulesets
from breakers.models import Command, CommandKind, CommandStatus
from breakers.recovery.service import consider_recovery
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.heartbeats import record_heartbeat
from incidents.models import Job, Recovery, RecoveryStatus, RecoveryVerdict, TimelineEntry
from incidents.reviews.writeup import load_review
from tests.support.authz import make_member, raise_alert

pytestmark = pytest.mark.django_db

NAN = "non-finite-loss-or-gradients"
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _recover_automatically(job_id: int) -> None:
    team = Job.objects.get(pk=job_id).team
    admin = make_member(team, "admin", prefix="admin")
    change = {"op": "update", "key": NAN, "fields": {"recovery": "recover"}}
    rulesets.change_rules(admin, team.pk, "recover NaN batches", [change])


def _brake(job_id: int, step: int, nodes: list[str]) -> Command:
    """Every rank's heartbeat, the NaN rule's alert (on rank 0's node) and the system's L3
    pause, not yet acknowledged."""
    for rank, node in enumerate(nodes):
        record_heartbeat(
            job_id, step=step, status="running", hostname=node, rank=rank, world_size=len(nodes)
        )
    signal = AlertSignal(
        rule_key=NAN,
        rule_name=NAN,
        layer="stability",
        severity="L3",
        metric="guard.skipped_updates",
        node=nodes[0],
        value=1.0,
        threshold=None,
        description=f"refused update at step {step}",
        step=step,
        time=T0 + timedelta(seconds=step),
        first_step=step,
        first_time=T0 + timedelta(seconds=step),
        action="checkpoint_and_pause",
    )
    alert = raise_or_update_alert(job_id, signal).alert
    pause = system_command(
        job_id,
        CommandKind.CHECKPOINT_AND_PAUSE,
        level="L3",
        reason="NaN",
        key="t",
        alert_id=alert.pk,
    )
    assert pause is not None
    return pause


def _saved(step: int, **extra) -> dict:
    return {
        "path": f"/ck/step-{step:08d}.pt",
        "sha256": "ab" * 32,
        "step": step,
        "weights_step": step - 1,
        "bytes": 100,
        **extra,
    }


def _flags(incident_id: int) -> list[TimelineEntry]:
    rows = TimelineEntry.objects.filter(incident_id=incident_id).order_by("pk")
    return [row for row in rows if row.data.get("event") == "rerun_attribution"]


def test_a_transient_fault_isolates_and_pages_naming_the_node(agent):
    _recover_automatically(agent.job_id)
    pause = _brake(agent.job_id, 30, ["gpu-a"])
    rerun = {"step": 30, "attribution": "transient"}
    acknowledge_command(agent.job_id, pause.pk, status="succeeded", result=_saved(30, rerun=rerun))
    recovery = consider_recovery(pause.pk)
    assert recovery is not None and recovery.verdict == RecoveryVerdict.ISOLATE_AND_PAGE
    assert recovery.status == RecoveryStatus.HELD and recovery.resume_command_id is None
    assert any("transient fault of the node gpu-a" in r for r in recovery.reasons)
    assert recovery.evidence["rerun"] == {
        "step": 30,
        "attribution": "transient",
        "rank": None,
        "node": "gpu-a",
    }
    (flag,) = _flags(recovery.incident_id)
    assert flag.message.startswith("Node gpu-a flagged: step 30")
    assert Command.objects.filter(kind=CommandKind.RESUME).count() == 0


def test_a_batch_that_repeats_is_flagged_and_recovered_past(agent):
    _recover_automatically(agent.job_id)
    pause = _brake(agent.job_id, 30, ["gpu-a"])
    rerun = {"step": 30, "attribution": "data"}
    acknowledge_command(agent.job_id, pause.pk, status="succeeded", result=_saved(30, rerun=rerun))
    recovery = consider_recovery(pause.pk)
    assert recovery is not None and recovery.verdict == RecoveryVerdict.RECOVER
    assert recovery.status == RecoveryStatus.ROLLING_BACK
    assert any("the data (or the model), not the node" in r for r in recovery.reasons)
    # The brake's checkpoint (weights of step 29, data position after step 30's batch).
    assert recovery.reasons[-1] == (
        "the batch of step 30 is behind the checkpoint's data position: not trained again"
    )
    (flag,) = _flags(recovery.incident_id)
    assert flag.message.startswith("Batch of step 30 flagged")
    assert flag.data["attribution"] == "data" and flag.data["node"] == "gpu-a"
    # The review says it where the incident's story is told.
    oncall = make_member(Job.objects.get(pk=agent.job_id).team, "oncall", prefix="oncall")
    review = load_review(oncall, recovery.incident_id)
    assert any(row.message.startswith("Batch of step 30 flagged") for row in review.rows)


def test_a_rule_that_holds_still_flags_on_the_timeline(agent):
    pause = _brake(agent.job_id, 12, ["gpu-a"])
    rerun = {"step": 12, "attribution": "transient"}
    acknowledge_command(agent.job_id, pause.pk, status="succeeded", result=_saved(12, rerun=rerun))
    assert consider_recovery(pause.pk) is None  # the default pack holds for a person
    (flag,) = _flags(pause.alert.incident_id)
    assert "Node gpu-a flagged" in flag.message


def test_one_ranks_transient_fault_names_that_ranks_node(agent):
    _recover_automatically(agent.job_id)
    pause = _brake(agent.job_id, 40, ["gpu-a", "gpu-b"])
    for rank, attribution in ((0, "data"), (1, "transient")):
        rerun = {"step": 40, "attribution": attribution}
        result = _saved(40, rerun=rerun, rank=rank)
        acknowledge_command(agent.job_id, pause.pk, status="succeeded", result=result, rank=rank)
    assert Command.objects.get(pk=pause.pk).status == CommandStatus.SUCCEEDED
    recovery = consider_recovery(pause.pk)
    assert recovery is not None and recovery.verdict == RecoveryVerdict.ISOLATE_AND_PAGE
    assert recovery.evidence["rerun"]["node"] == "gpu-b"
    assert (recovery.rank, recovery.node) == (1, "gpu-b")  # the suspect, not the alert's node
    assert recovery.evidence["rerun"]["rank"] == 1
    assert [(f.data["rank"], f.data["node"]) for f in _flags(recovery.incident_id)] == [
        (0, "gpu-a"),
        (1, "gpu-b"),
    ]


def test_a_rerun_of_another_step_does_not_weigh(agent):
    _recover_automatically(agent.job_id)
    pause = _brake(agent.job_id, 30, ["gpu-a"])
    rerun = {"step": 12, "attribution": "transient"}  # an earlier trip, not this window's
    acknowledge_command(agent.job_id, pause.pk, status="succeeded", result=_saved(30, rerun=rerun))
    recovery = consider_recovery(pause.pk)
    assert recovery is not None and recovery.verdict == RecoveryVerdict.RECOVER
    assert recovery.evidence["rerun"] is None
    assert Recovery.objects.count() == 1


@pytest.mark.parametrize(
    ("rerun", "field"),
    [
        ("data", "result.rerun"),
        ([30, "data"], "result.rerun"),
        ({"step": 30}, "result.rerun.attribution"),
        ({"step": 30, "attribution": "hardware"}, "result.rerun.attribution"),
        ({"step": 30, "attribution": None}, "result.rerun.attribution"),
        ({"attribution": "data"}, "result.rerun.step"),
        ({"step": -1, "attribution": "data"}, "result.rerun.step"),
        ({"step": True, "attribution": "data"}, "result.rerun.step"),
        ({"step": 2**70, "attribution": "data"}, "result.rerun.step"),
        ({"step": "30", "attribution": "data"}, "result.rerun.step"),
        ({"step": 30, "attribution": "data", "node": "gpu-a"}, "result.rerun.node"),
        ({"step": 30, "attribution": "data", "n\u00e9\u0000": 1}, "result.rerun.n\\xe9\\x00"),
    ],
)
def test_a_rerun_that_is_not_one_is_refused_naming_its_field(agent, agent_post, rerun, field):
    alert = raise_alert(agent.job_id, "L3")
    command = issue_command(
        agent.job_id, "checkpoint_and_pause", reason="brake", alert_id=alert.pk
    ).command
    rows = TimelineEntry.objects.count()
    body = {"status": "succeeded", "result": _saved(5, rerun=rerun)}
    response = agent_post(f"/api/v1/agent/commands/{command.pk}/ack", body)
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"], response.json()
    assert Command.objects.get(pk=command.pk).status != CommandStatus.SUCCEEDED
    assert TimelineEntry.objects.count() == rows


def test_a_null_rerun_is_no_finding(agent, agent_post):
    command = issue_command(agent.job_id, "checkpoint_and_pause", reason="brake").command
    body = {"status": "succeeded", "result": _saved(5, rerun=None)}
    response = agent_post(f"/api/v1/agent/commands/{command.pk}/ack", body)
    assert response.status_code == 200, response.content
