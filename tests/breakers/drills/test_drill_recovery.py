"""``manage.py drill --scenario poisoned_batch`` against the real stack: a drill of the
automatic recovery path. The built-in PyTorch workload (the SDK, a real sandbox process) gets
one NaN batch; the Celery worker's rules brake it; the console records the verdict RECOVER,
then rolls the sandbox back to its clean checkpoint; the SDK verifies the hash, restores, and
training goes on past the poisoned batch — every step judged on the scorecard.

The team's rules are the default pack's, which hold for a person: a drill never changes them,
and the recovery acts on the drill's own sandbox job and nothing else. The run is then read
through the goodput ledger, whose figures must be its own timeline's, to the second.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from breakers.detection.rules import effective_rules
from breakers.ledger import goodput_ledger
from breakers.models import Checkpoint, Command, CommandKind, DrillRun, DrillStatus
from incidents.models import (
    FINAL_JOB_STATUSES,
    ActorKind,
    Incident,
    Job,
    Recovery,
    RecoveryStatus,
    RecoveryVerdict,
    TimelineEntry,
)
from tests.support.drills import END_TO_END_MARKS, RECOVERY_LINES, SCORECARD_LINES, drill

pytestmark = END_TO_END_MARKS

LINES = SCORECARD_LINES + RECOVERY_LINES


def test_a_drill_of_the_recovery_path_recovers_its_own_sandbox(live_console, drill_team):
    output, code = drill(live_console, "--scenario", "poisoned_batch")
    print(output)
    run = DrillRun.objects.get(team=drill_team)
    assert code == 0 and run.status == DrillStatus.PASSED, (run.error, output)
    assert list(run.checks.values_list("name", flat=True)) == LINES
    sandbox = Job.objects.get(pk=run.job_id)
    assert sandbox.drill_sandbox

    # The verdict, recorded before the system acted, says it is a drill of the recovery path.
    (recovery,) = Recovery.objects.all()
    assert recovery.job_id == sandbox.pk
    assert recovery.verdict == RecoveryVerdict.RECOVER
    assert recovery.status == RecoveryStatus.RECOVERED
    assert any("a drill of the recovery path" in reason for reason in recovery.reasons)
    assert recovery.evidence["drill_of_recovery"] is True
    assert recovery.evidence["min_progress_steps"] == 10
    # The one roll back of the console went to the sandbox, by the system, and succeeded.
    (resume,) = Command.objects.filter(kind=CommandKind.RESUME)
    assert resume.job_id == sandbox.pk and resume.issued_by_kind == ActorKind.SYSTEM
    assert resume.result["rolled_back"] is True
    assert resume.result["restored_step"] == recovery.checkpoint_step
    assert recovery.first_step == run.fault_step
    # The poisoned step's batch never trained on again; training went on past it.
    skipped = run.checks.get(name="step skipped").measured
    assert skipped.startswith(f"step {run.fault_step}: ") and "trained on again" not in skipped
    assert "every loss finite" in run.checks.get(name="resumed").measured
    assert "after the brake" in run.checks.get(name="time to recover").measured
    # The team's rules still hold for a person: the drill changed none of them.
    policies = {rule.key: rule.recovery for rule in effective_rules(drill_team.pk)}
    assert policies["non-finite-loss-or-gradients"] == "hold"
    assert f"Drill #{run.pk} poisoned_batch" in output and "PASSED" in output
    _the_ledger_reads_the_runs_own_timeline(sandbox, recovery, drill_team)


def _the_ledger_reads_the_runs_own_timeline(job: Job, recovery: Recovery, team) -> None:
    """The ledger of the braked and recovered run, phase by phase, against the rows of its own
    timeline: detection (first anomalous point → alert), no decision (an automatic L3), saving
    (alert → the brake's checkpoint confirmed), recovery (→ rolled back and resumed), lost
    progress (the restored checkpoint's writing → the first anomalous point, 0 when it was
    written after); then the job's wall time and what is left productive. The ledger leaves
    drill sandboxes out (their faults are on purpose): the run is counted as a team's job."""
    Job.objects.filter(pk=job.pk).update(drill_sandbox=False)
    job.refresh_from_db()
    incident = Incident.objects.get(pk=recovery.incident_id)
    rows = TimelineEntry.objects.filter(incident=incident).order_by("at", "pk")
    alert = rows.filter(kind="alert_raised").first()
    stop = rows.filter(kind="checkpoint_saved", at__gte=alert.at, pk__gt=alert.pk).first()
    resumed = rows.filter(kind="resumed", at__gte=stop.at, pk__gt=stop.pk).first()
    assert resumed.data["event"] == "rolled_back" and resumed.actor_kind == "agent"
    restored = Checkpoint.objects.filter(job=job, step=resumed.data["step"])
    written = restored.order_by("reported_at").first().reported_at
    first = incident.first_time
    expected = {
        "lost_progress": max(0.0, (first - written).total_seconds()),
        "detection": (alert.at - first).total_seconds(),
        "decision": 0.0,
        "saving": (stop.at - alert.at).total_seconds(),
        "recovery": (resumed.at - stop.at).total_seconds(),
    }
    assert job.status in FINAL_JOB_STATUSES  # the drill ended its sandbox
    ended = max(t for t in (job.created_at, job.last_heartbeat_at, job.last_metric_at) if t)
    admin = team.memberships.get(role="admin").user
    since, until = job.created_at - timedelta(hours=1), ended + timedelta(hours=1)
    ledger = goodput_ledger(admin, team.pk, since, until, job_id=job.pk)
    (cost,) = ledger["incidents"]
    (line,) = ledger["jobs"]
    print("ledger", cost, line, "expected", expected)
    assert cost["lost"] == pytest.approx(expected, abs=1e-3)
    assert cost["alarm_after_seconds"] == pytest.approx(expected["detection"], abs=1e-3)
    braked_after = (stop.at - first).total_seconds()
    assert cost["brake_after_seconds"] == pytest.approx(braked_after, abs=1e-3)
    wall = (ended - job.created_at).total_seconds()
    lost = sum(expected.values())
    assert line["wall_seconds"] == pytest.approx(wall, abs=1e-3)
    assert line["lost_seconds"] == pytest.approx(lost, abs=1e-3)
    assert line["productive_seconds"] == pytest.approx(wall - lost, abs=1e-3)
    assert line["ettr"] == pytest.approx((wall - lost) / wall, abs=1e-6)
    # A recovery that is the run's own: seconds, not the run's whole remaining life.
    assert 0 < expected["recovery"] < 60 and 0 < lost < wall
