"""The brake keeps the last good state, and a roll back rolls back (issue 14), on the real stack.

A training subprocess (tests/brakeline/scripts/train_rollback.py) meets a poisoned batch at
step POISON_AT: its inputs are NaN, so are the loss and the gradients. The SDK's step guard
skips that update, sends the point at once and holds at the boundary; the console's L3 rule
answers checkpoint_and_pause; the checkpoint lands in the catalogue, clean. A person rolls back
to the preselected entry through the same service the API and the pages use; training goes on
and its losses equal, bit for bit, those of an uninterrupted run that skipped the same batch.
"""

from __future__ import annotations

import pytest

from breakers import checkpoints
from breakers.control.commands import issue_command
from breakers.control.job_actions import confirm_pause
from breakers.models import Command, CommandKind, CommandStatus
from breakers.storage.points import stored_points
from core.errors import InvalidInput
from incidents.alerts.acknowledge import acknowledge_alert
from incidents.models import Incident, IncidentStatus, Job, JobStatus, TimelineEntry
from incidents.reviews.writeup import load_review
from tests.brakeline.live import same_losses_after, wait_for
from tests.support.authz import make_member

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("worker"),
]

STEPS = 80
POISON_AT = 30


def _succeeded_pauses(job_id: int) -> list[Command]:
    return list(
        Command.objects.filter(
            job_id=job_id, kind=CommandKind.CHECKPOINT_AND_PAUSE, status=CommandStatus.SUCCEEDED
        ).order_by("pk")
    )


def _paused(job_id: int, training, count: int = 1) -> Command:
    wait_for(
        lambda: (
            len(_succeeded_pauses(job_id)) >= count
            and Job.objects.get(pk=job_id).status == JobStatus.PAUSED
        ),
        f"checkpoint_and_pause #{count} to be acknowledged",
        timeout=90,
        training=training,
    )
    return _succeeded_pauses(job_id)[count - 1]


def _braked_clean(job_id: int, result: dict, braked) -> tuple[dict, Incident]:
    """Zero poisoned steps, zero steps past the anomaly: held at the poisoned step's boundary,
    and the saved weights hold no update from it; catalogued clean and preselected."""
    assert result["step"] == POISON_AT and result["weights_step"] == POISON_AT - 1
    assert braked.steps_done() == POISON_AT
    assert not any(p.step > POISON_AT for p in stored_points(job_id))
    entries = checkpoints.catalogue(job_id)
    brake = next(e for e in entries if e["sha256"] == result["sha256"])
    assert brake["clean"] and brake["preselected"] and brake["reason"] == "brake"
    assert [e["step"] for e in entries if e["reason"] == "manual"] == [28, 21, 14, 7]
    incident = Incident.objects.get(job_id=job_id)
    saved = TimelineEntry.objects.get(incident=incident, kind="checkpoint_saved")
    assert result["sha256"] in saved.message and saved.data["clean"] is True
    return brake, incident


def test_a_poisoned_batch_is_braked_clean_and_rolled_back_bit_for_bit(
    live_console, agent, training
):
    reference = training.start(
        "train_rollback.py", "reference", "--steps", STEPS, "--skip-step", POISON_AT
    )
    console = {"url": live_console, "token": agent.token}
    braked = training.start(
        "train_rollback.py",
        "braked",
        "--steps",
        STEPS,
        "--poison-at",
        POISON_AT,
        "--checkpoint-every",
        7,
        "--step-seconds",
        0.02,
        **console,
    )
    pause = _paused(agent.job_id, braked)
    result = pause.result
    brake, incident = _braked_clean(agent.job_id, result, braked)

    oncall = make_member(Job.objects.get(pk=agent.job_id).team, "oncall")
    acknowledge_alert(oncall, pause.alert_id, note="poisoned batch: rolling back")
    with pytest.raises(InvalidInput) as refused:
        confirm_pause(oncall, agent.job_id, decision="roll_back", checkpoint="/nonexistent/ckpt.pt")
    assert "checkpoint" in refused.value.fields
    confirm_pause(oncall, agent.job_id, decision="roll_back", checkpoint=str(brake["id"]))

    # The rolled back run's losses after the poison equal those of a run that skipped it.
    same_losses_after(reference, braked, POISON_AT, STEPS)
    rolled = TimelineEntry.objects.get(incident=incident, data__event="rolled_back")
    assert f"Rolled back to step {POISON_AT}" in rolled.message
    # The episode ended on healthy points after the resume; every step is on its timeline.
    wait_for(
        lambda: Incident.objects.get(pk=incident.pk).status == IncidentStatus.RESOLVED,
        "the incident to resolve once the job trains healthy again",
        timeout=60,
    )
    kinds = set(TimelineEntry.objects.filter(incident=incident).values_list("kind", flat=True))
    assert {"command_issued", "checkpoint_saved", "resumed", "incident_resolved"} <= kinds
    # The review measures every link of the chain and shows the checkpoint's hash.
    review = load_review(oncall, incident.pk)
    for key in ("detect", "acknowledge", "brake", "recover"):
        assert review.durations.link(key).measured, key
    assert any(result["sha256"] in row.message for row in review.rows)


def test_a_recurrence_after_resume_brakes_again(live_console, agent, training):
    """Without the guard the NaN reaches the weights; resumed as it is, the NaN recurs at once
    and must be braked a second time (its rule re-armed on the resume)."""
    console = {"url": live_console, "token": agent.token}
    braked = training.start(
        "train_rollback.py",
        "recurrence",
        "--steps",
        STEPS,
        "--poison-at",
        POISON_AT,
        "--no-guard",
        "--step-seconds",
        0.02,
        **console,
    )
    first = _paused(agent.job_id, braked)
    # No guard: the SDK cannot vouch for the weights, the catalogue judges by the step.
    assert "weights_step" not in first.result and first.result["step"] > POISON_AT
    entry = next(e for e in checkpoints.catalogue(agent.job_id) if e["reason"] == "brake")
    assert entry["clean"] is False
    oncall = make_member(Job.objects.get(pk=agent.job_id).team, "oncall")
    confirm_pause(oncall, agent.job_id, decision="resume")
    second = _paused(agent.job_id, braked, count=2)
    assert second.pk != first.pk and second.result["step"] > first.result["step"]
    issue_command(agent.job_id, CommandKind.TERMINATE, reason="weights are NaN: stop")
    assert braked.wait(timeout=60) == 75, braked.tail()
