"""A point logged before a resume but evaluated after it must not brake the resumed run again.

Seen on a loaded CI machine: the step guard's ``guard.skipped_updates`` point of the poisoned
step reached the evaluator only after the person's roll back had been acknowledged. The resume
had re-armed the brake's rules (a recurrence must brake again), so that old point raised a new
L3 alert and paused the freshly resumed run three steps later, for an anomaly already braked.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from breakers.agent.points import PointIn
from breakers.agent.store import store_points
from breakers.control.acknowledge import acknowledge_command
from breakers.control.job_actions import confirm_pause
from breakers.detection.evaluation import evaluate_job
from breakers.detection.rules import install_default_pack
from breakers.models import Command, CommandKind
from incidents.models import Alert, Job, JobStatus, TimelineEntry
from tests.support.authz import make_member

pytestmark = pytest.mark.django_db

NAN_AT = 30
NAN = float("nan")


def _pauses(job_id: int) -> list[Command]:
    return list(
        Command.objects.filter(job_id=job_id, kind=CommandKind.CHECKPOINT_AND_PAUSE).order_by("pk")
    )


@pytest.fixture
def resumed(agent):
    """Braked at NAN_AT on a NaN loss, paused, resumed by a person; returns the time the
    resume was acknowledged (the console's clock)."""
    install_default_pack()
    start = timezone.now() - timedelta(minutes=5)
    healthy = [
        PointIn("loss", s, 2.0 + (s % 7) * 0.01, start + timedelta(seconds=s), None, 0)
        for s in range(NAN_AT)
    ]
    store_points(agent.job_id, [*healthy, PointIn("loss", NAN_AT, NAN, None, None, 0)])
    evaluate_job(agent.job_id)
    [pause] = _pauses(agent.job_id)
    acknowledge_command(
        agent.job_id, pause.pk, status="succeeded", result={"step": NAN_AT, "weights_step": 29}
    )
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.PAUSED
    oncall = make_member(job.team, "oncall")
    confirmation = confirm_pause(oncall, agent.job_id, decision="resume")
    acknowledge_command(
        agent.job_id, confirmation.command_id, status="succeeded", result={"step": NAN_AT}
    )
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.RUNNING
    return Command.objects.get(pk=confirmation.command_id).acknowledged_at


def test_the_guards_point_of_the_braked_step_arriving_late_does_not_brake_again(agent, resumed):
    logged = resumed - timedelta(seconds=2)  # by the SDK, before the resume
    store_points(agent.job_id, [PointIn("guard.skipped_updates", NAN_AT, 1.0, logged, None, 0)])
    evaluate_job(agent.job_id)
    assert len(_pauses(agent.job_id)) == 1
    assert not Alert.objects.filter(job_id=agent.job_id, rule_key="update-refused-by-guard")
    note = TimelineEntry.objects.get(
        incident__job_id=agent.job_id, data__event="logged_before_resume"
    )
    assert note.step == NAN_AT and "guard.skipped_updates" in note.message
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.RUNNING


def test_every_ranks_late_point_is_one_note_and_no_brake(agent, resumed):
    logged = resumed - timedelta(seconds=2)
    late = [PointIn("guard.skipped_updates", NAN_AT, 1.0, logged, None, r) for r in range(8)]
    store_points(agent.job_id, late)
    evaluate_job(agent.job_id)
    assert len(_pauses(agent.job_id)) == 1
    notes = TimelineEntry.objects.filter(data__event="logged_before_resume")
    assert notes.count() == 1


def test_a_recurrence_after_the_resume_still_brakes_in_the_same_chunk(agent, resumed):
    logged = resumed - timedelta(seconds=2)
    store_points(
        agent.job_id,
        [
            PointIn("guard.skipped_updates", NAN_AT, 1.0, logged, None, 0),
            PointIn("guard.skipped_updates", NAN_AT + 3, 2.0, None, None, 0),
        ],
    )
    evaluate_job(agent.job_id)
    first, second = _pauses(agent.job_id)
    assert second.alert.rule_key == "update-refused-by-guard"
    assert "step 33" in second.reason


@pytest.mark.parametrize(
    "step, after",
    [
        pytest.param(NAN_AT + 1, timedelta(seconds=-2), id="a later step, logged before"),
        pytest.param(5, timedelta(seconds=1), id="an earlier step, logged after (a restart)"),
    ],
)
def test_points_not_from_before_the_resume_brake_as_usual(agent, resumed, step, after):
    store_points(agent.job_id, [PointIn("loss", step, NAN, resumed + after, None, 0)])
    evaluate_job(agent.job_id)
    assert len(_pauses(agent.job_id)) == 2
    assert not TimelineEntry.objects.filter(data__event="logged_before_resume").exists()
