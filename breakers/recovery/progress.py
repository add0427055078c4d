"""Where an automatic recovery stands once it is under way: the job's answer to the roll
back, and the end of a recovery with its timeline row. Called by the control plane
(``breakers.control.commands``) in the acknowledgement's transaction; imports no command
service, so the control plane can call it."""

from __future__ import annotations

from celery import current_app
from django.db import transaction
from django.utils import timezone

from breakers.models import Command, CommandKind, CommandStatus
from core.realtime import job_group, publish_after_commit
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import append_timeline
from incidents.models import RECOVERY_TRANSITIONS, ActorKind, Recovery, RecoveryStatus, TimelineKind
from incidents.recoveries import stop_automatic_recovery

# Registered by breakers.control.tasks, which BreakersConfig.ready imports in every process.
CONSIDER = "control.consider_recovery"

FINISHED_WORDS = {
    RecoveryStatus.RECOVERED: "Automatic recovery done: rolled back, resumed",
    RecoveryStatus.FAILED: "Automatic recovery failed",
    RecoveryStatus.HELD: "No automatic recovery: the job stays paused for a person",
}


def finish(recovery: Recovery, status: str, detail: str) -> bool:
    """Move the recovery to a final status, with its timeline row (the system's); False when
    it had moved already (a person took over first)."""
    won = compare_and_swap(
        Recovery,
        recovery.pk,
        table=RECOVERY_TRANSITIONS,
        expected=[recovery.status],
        new=status,
        finished_at=timezone.now(),
    )
    if not won:
        return False
    append_timeline(
        recovery.incident_id,
        TimelineKind.NOTE,
        FINISHED_WORDS[RecoveryStatus(status)] + (f" — {detail}" if detail else ""),
        alert_id=recovery.alert_id,
        data={"event": f"recovery_{status}", "recovery_id": recovery.pk},
    )
    publish_after_commit(
        job_group(recovery.job_id),
        {"type": "incident.updated", "incident_id": recovery.incident_id},
    )
    return True


def resume_answered(command: Command) -> None:
    """The job answered an automatic recovery's resume: rolled back and resumed, or not."""
    recovery = Recovery.objects.filter(resume_command_id=command.pk).first()
    if recovery is None or recovery.status != RecoveryStatus.ROLLING_BACK:
        return
    result = command.result
    restored = result.get("restored_step")
    if command.status == CommandStatus.SUCCEEDED and result.get("rolled_back"):
        skipped = recovery.skip_steps
        detail = f"the job restored step {restored}" + (
            f" and drops the batches of steps {skipped}" if skipped else ""
        )
        finish(recovery, RecoveryStatus.RECOVERED, detail)
    else:
        finish(recovery, RecoveryStatus.FAILED, command.error or "the job did not roll back")


def brake_confirmed(command: Command) -> None:
    """An automatic L3 brake's checkpoint is confirmed: the verdict is considered after
    commit (the catalogue entry it rolls back to commits with this acknowledgement)."""
    if (
        command.kind == CommandKind.CHECKPOINT_AND_PAUSE
        and command.issued_by_kind == ActorKind.SYSTEM
        and command.severity == "L3"
        and command.alert_id is not None
    ):
        pause_id = command.pk
        # By the task's name: the task module is built on the command services that call this.
        transaction.on_commit(lambda: current_app.tasks[CONSIDER].delay(pause_id))


def person_commanded(command: Command, incident_id: int | None) -> None:
    """A person's command to a job under automatic recovery takes its incident over."""
    if command.issued_by_kind != ActorKind.PERSON or incident_id is None:
        return
    if Recovery.objects.filter(incident_id=incident_id).exists():
        stop_automatic_recovery(
            incident_id, command.issued_by, f"{command.kind} #{command.pk} sent by a person"
        )
