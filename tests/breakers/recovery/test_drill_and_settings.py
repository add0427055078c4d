"""Which jobs the verdict treats as drills of the recovery path (and which never), and the
operator's thresholds of the verdict (BRAKELINE_RECOVERY_*): read by the evidence, recorded
with it, and refused at start-up when they make no sense.

The job's side is played by acknowledging its commands as the agent would (as in
test_service.py); the drill with a real sandbox process is
tests/breakers/drills/test_drill_recovery.py."""

from __future__ import annotations

import pytest

from breakers.models import Command, CommandKind, DrillRun
from breakers.recovery.service import consider_recovery
from incidents.models import Job, Recovery, RecoveryVerdict
from tests.breakers.recovery.test_service import _brake, _policy, _roll_back_done
from tests.console.test_settings_modes import settings_probe

pytestmark = pytest.mark.django_db

PHRASE = "a drill of the recovery path: it acts on its own sandbox job only"


def _drill_of(job_id: int, scenario: str, *, sandbox: bool = True) -> None:
    job = Job.objects.get(pk=job_id)
    Job.objects.filter(pk=job_id).update(drill_sandbox=sandbox)
    DrillRun.objects.create(team=job.team, scenario=scenario, job=job)


def test_an_ordinary_drill_holds_even_under_a_recover_rule(agent):
    _policy(agent.job_id)
    _drill_of(agent.job_id, "nan_loss")
    recovery = consider_recovery(_brake(agent.job_id, 30).pk)
    assert recovery.verdict == RecoveryVerdict.HOLD
    assert any("drill sandbox" in reason for reason in recovery.reasons)
    assert recovery.evidence["drill_of_recovery"] is False
    assert not Command.objects.filter(kind=CommandKind.RESUME).exists()


def test_a_drill_of_the_recovery_path_recovers_its_sandbox_under_the_teams_hold_rule(agent):
    """The team's rule holds for a person (the default pack): the drill's sandbox still
    rehearses the recovery path, and the rule stays as it was."""
    _drill_of(agent.job_id, "poisoned_batch")
    recovery = consider_recovery(_brake(agent.job_id, 30).pk)
    assert recovery.verdict == RecoveryVerdict.RECOVER, recovery.reasons
    assert PHRASE in recovery.reasons
    assert recovery.evidence["drill_of_recovery"] is True
    (resume,) = Command.objects.filter(kind=CommandKind.RESUME)
    assert resume.job_id == agent.job_id
    _roll_back_done(recovery)
    recovery.refresh_from_db()
    assert recovery.status == "recovered"


def test_a_real_job_never_takes_a_drills_recovery(make_agent):
    """A drill row naming a team's real job (not created as a sandbox) changes nothing: its
    hold rule still holds, and its recover rule recovers as any real job's, not as a drill."""
    held, recovering = make_agent(), make_agent()
    for agent in (held, recovering):
        _drill_of(agent.job_id, "poisoned_batch", sandbox=False)
    assert consider_recovery(_brake(held.job_id, 30).pk) is None
    assert not Recovery.objects.filter(job_id=held.job_id).exists()
    assert not Command.objects.filter(job_id=held.job_id, kind=CommandKind.RESUME).exists()
    _policy(recovering.job_id)
    recovery = consider_recovery(_brake(recovering.job_id, 30).pk)
    assert recovery.verdict == RecoveryVerdict.RECOVER
    assert PHRASE not in recovery.reasons and recovery.evidence["drill_of_recovery"] is False


def test_the_operators_thresholds_decide_and_are_recorded(agent, settings):
    settings.RECOVERY_MIN_PROGRESS_STEPS = 50
    settings.RECOVERY_MAX_SKIP_STEPS = 7
    _policy(agent.job_id)
    first = consider_recovery(_brake(agent.job_id, 30).pk)
    assert first.verdict == RecoveryVerdict.RECOVER
    assert (first.evidence["min_progress_steps"], first.evidence["max_skip_steps"]) == (50, 7)
    _roll_back_done(first)
    # 49 healthy steps since: progress under the default 10, not under the operator's 50.
    second = consider_recovery(_brake(agent.job_id, 80).pk)
    assert second.verdict == RecoveryVerdict.STOP_AND_PAGE, second.reasons
    assert any("only 49 healthy step(s) since, fewer than 50" in r for r in second.reasons)


@pytest.mark.parametrize(
    ("env", "sentence"),
    [
        (
            {"BRAKELINE_RECOVERY_MIN_PROGRESS_STEPS": "0"},
            "BRAKELINE_RECOVERY_MIN_PROGRESS_STEPS=0 is below 1.",
        ),
        (
            {"BRAKELINE_RECOVERY_MIN_PROGRESS_STEPS": "ten"},
            "BRAKELINE_RECOVERY_MIN_PROGRESS_STEPS='ten' is not a whole number.",
        ),
        (
            {"BRAKELINE_RECOVERY_MAX_SKIP_STEPS": "-1"},
            "BRAKELINE_RECOVERY_MAX_SKIP_STEPS=-1 is below 0.",
        ),
        (
            {"BRAKELINE_RECOVERY_MAX_SKIP_STEPS": "1.5"},
            "BRAKELINE_RECOVERY_MAX_SKIP_STEPS='1.5' is not a whole number.",
        ),
    ],
)
def test_a_bad_threshold_refuses_to_start_with_one_sentence(tmp_path, env, sentence):
    result = settings_probe(tmp_path, **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and sentence in result.stderr
