"""Automatic recovery on the real stack: a poisoned batch braked, rolled back, skipped and
resumed with no person, bit for bit; the same poison again at once is stopped, not looped.

The training subprocess is tests/brakeline/scripts/train_rollback.py (as in
test_integration_live_rollback.py): step POISON_AT's inputs are NaN, the SDK's step guard
keeps that update out of the weights and holds; the team's NaN rules say *recover
automatically* (docs/recovery.md), so once the brake's checkpoint is confirmed the console
records its verdict, then rolls back to the last clean checkpoint, as the system.
"""

from __future__ import annotations

from breakers.models import Command, CommandKind, CommandStatus
from incidents.models import (
    ActorKind,
    Incident,
    Job,
    JobStatus,
    Recovery,
    RecoveryStatus,
    RecoveryVerdict,
    TimelineEntry,
)
from incidents.reviews.writeup import load_review
from tests.brakeline.live import (
    LIVE_STACK_MARKS,
    recover_automatically,
    same_losses_after,
    wait_for,
)
from tests.support.authz import make_member

pytestmark = LIVE_STACK_MARKS

STEPS = 60
POISON_AT = 30


def _start(training, name: str, console: dict, *poison: int):
    args = [arg for step in poison for arg in ("--poison-at", step)]
    return training.start(
        "train_rollback.py",
        name,
        "--steps",
        STEPS,
        *args,
        "--checkpoint-every",
        7,
        "--step-seconds",
        0.02,
        **console,
    )


def _recoveries(job_id: int) -> list[Recovery]:
    return list(Recovery.objects.filter(job_id=job_id).order_by("pk"))


def _events(incident: Incident) -> list[tuple[int, str, str]]:
    rows = TimelineEntry.objects.filter(incident=incident).order_by("pk")
    return [(row.pk, row.data.get("event", row.kind), row.actor_kind) for row in rows]


def test_a_poisoned_batch_is_recovered_automatically_bit_for_bit(live_console, agent, training):
    recover_automatically(agent.job_id, recovery_budget=3)
    reference = training.start(
        "train_rollback.py", "reference", "--steps", STEPS, "--skip-step", POISON_AT
    )
    braked = _start(training, "recovered", {"url": live_console, "token": agent.token}, POISON_AT)
    wait_for(
        lambda: any(r.status == RecoveryStatus.RECOVERED for r in _recoveries(agent.job_id)),
        "the automatic recovery to roll back and resume",
        timeout=120,
        training=braked,
    )
    # Training went on from the clean checkpoint without the poisoned batch: its losses after
    # the poison are those of a run that never trained on that batch, bit for bit.
    same_losses_after(reference, braked, POISON_AT, STEPS)

    (recovery,) = _recoveries(agent.job_id)
    assert recovery.verdict == RecoveryVerdict.RECOVER and recovery.cause == "nan-inf"
    assert (recovery.first_step, recovery.last_step, recovery.checkpoint_step) == (30, 30, 30)
    assert any("first time for this cause" in reason for reason in recovery.reasons)
    resume = Command.objects.get(pk=recovery.resume_command_id)
    assert resume.kind == CommandKind.RESUME and resume.issued_by_kind == ActorKind.SYSTEM
    assert resume.status == CommandStatus.SUCCEEDED and resume.result["rolled_back"] is True
    assert resume.params["catalogue_id"] == recovery.checkpoint_id
    _every_step_on_the_timeline(recovery, resume)


def _every_step_on_the_timeline(recovery: Recovery, resume: Command) -> None:
    """Verdict, roll back requested, rolled back, done: in that order, the verdict recorded
    before the command that acts on it, by the system (the job's own answer by the agent)."""
    events = _events(recovery.incident)
    order = [event for _, event, _ in events]
    position = {event: order.index(event) for event in order}
    issued = next(
        i
        for i, (pk, _, _) in enumerate(events)
        if TimelineEntry.objects.get(pk=pk).data.get("command_id") == resume.pk
    )
    assert (
        position["checkpoint_saved"]
        < position["recovery_verdict"]
        < issued
        < position["recovery_roll_back_requested"]
        < position["rolled_back"]
        < position["recovery_recovered"]
    ), order
    actors = {event: actor for _, event, actor in events}
    assert actors["recovery_verdict"] == actors["recovery_recovered"] == ActorKind.SYSTEM
    review = load_review(make_member(recovery.job.team, "oncall"), recovery.incident_id)
    assert any("Recovery verdict" in row.message for row in review.rows)


def test_the_same_poison_right_after_a_recovery_is_stopped_not_looped(
    live_console, agent, training
):
    recover_automatically(agent.job_id, recovery_budget=3)
    console = {"url": live_console, "token": agent.token}
    braked = _start(training, "repeat", console, POISON_AT, POISON_AT + 1)
    wait_for(
        lambda: len(_recoveries(agent.job_id)) >= 2,
        "a second verdict after the recovery",
        timeout=150,
        training=braked,
    )
    first, second = _recoveries(agent.job_id)
    assert first.verdict == RecoveryVerdict.RECOVER
    assert second.verdict == RecoveryVerdict.STOP_AND_PAGE, second.reasons
    assert second.status == RecoveryStatus.HELD and second.first_step == POISON_AT + 1
    assert any("same cause (nan-inf)" in r and "no progress" in r for r in second.reasons)
    # Not looped: the job stays paused for a person, with one automatic resume in all.
    wait_for(
        lambda: Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSED,
        "the job to stay paused",
    )
    resumes = Command.objects.filter(job_id=agent.job_id, kind=CommandKind.RESUME)
    assert resumes.count() == 1
    events = [event for _, event, _ in _events(second.incident)]
    assert events.count("recovery_verdict") == 2 and "recovery_held" in events
    oncall = make_member(Job.objects.get(pk=agent.job_id).team, "manager")
    from breakers.control.job_actions import terminate_job

    terminate_job(oncall, agent.job_id, reason="the data repeats the poison: stop")
    assert braked.wait(timeout=60) == 75, braked.tail()
    incident = Incident.objects.get(pk=second.incident_id)
    assert incident.taken_over_by == oncall  # a person's command takes the incident over
