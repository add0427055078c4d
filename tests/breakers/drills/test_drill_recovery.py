"""``manage.py drill --scenario poisoned_batch`` against the real stack: a drill of the
automatic recovery path. The built-in PyTorch workload (the SDK, a real sandbox process) gets
one NaN batch; the Celery worker's rules brake it; the console records the verdict RECOVER,
then rolls the sandbox back to its clean checkpoint; the SDK verifies the hash, restores, and
training goes on past the poisoned batch — every step judged on the scorecard.

The team's rules are the default pack's, which hold for a person: a drill never changes them,
and the recovery acts on the drill's own sandbox job and nothing else.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from breakers.detection.rules import effective_rules
from breakers.models import Command, CommandKind, DrillRun, DrillStatus
from incidents.models import ActorKind, Job, Recovery, RecoveryStatus, RecoveryVerdict

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("watchdog_beat"),
]

LINES = [
    "breaker fired",
    "time to detect",
    "time to brake",
    "checkpoint saved",
    "checkpoint loads",
    "checkpoint before the anomaly",
    "release",
    "paged",
    "timeline complete",
    "verdict recorded",
    "rolled back",
    "step skipped",
    "resumed",
    "time to recover",
]


def drill(live_console: str, *arguments: str) -> tuple[str, int]:
    out = io.StringIO()
    try:
        call_command(
            "drill", "--team", "research", "--console-url", live_console, *arguments, stdout=out
        )
        return out.getvalue(), 0
    except CommandError as error:
        return out.getvalue(), error.returncode


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
