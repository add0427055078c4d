"""The job's answer to a command: recorded once, with its effect on the job and the timeline.

Every answer goes through ``acknowledge_command``: the agent's (one per rank of a multi-rank
job), and the Slurm executor's when it carried out a routed command itself
(``breakers.executors.slurm.actions``). Issuing is ``breakers.control.commands``.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from breakers.checkpoints import record_from_acknowledgement
from breakers.control.acks import clear_split, counts_ranks, record_rank_ack
from breakers.control.failed_brake import raise_failed_brake_alert
from breakers.control.job_state import ON_SUCCESS
from breakers.control.payload import command_payload
from breakers.control.timeline import record_acknowledged
from breakers.control.unapplied import clear_unapplied
from breakers.models import COMMAND_TRANSITIONS, Command, CommandKind, CommandStatus
from breakers.recovery.progress import brake_confirmed, resume_answered
from core.errors import NotFound
from core.realtime import job_group, publish_after_commit
from core.transitions import compare_and_swap, compare_and_swap_all
from incidents.jobs import move_job
from incidents.models import (
    ISOLATABLE_NODE_STATUSES,
    NODE_TRANSITIONS,
    Job,
    Node,
    NodeStatus,
)

DONE_COMMAND_STATUSES = (CommandStatus.SUCCEEDED, CommandStatus.FAILED)


def _job_effect_on_success(command: Command) -> None:
    """Job status follows acknowledgements: paused only once the checkpoint is confirmed."""
    if command.kind == CommandKind.ISOLATE_NODE and command.params.get("node"):
        # The node is out of the job only once the job (or its scheduler) says it is.
        compare_and_swap_all(
            Node.objects.filter(job_id=command.job_id, hostname=command.params["node"]),
            table=NODE_TRANSITIONS,
            expected=ISOLATABLE_NODE_STATUSES,
            new=NodeStatus.ISOLATED,
        )
    event = ON_SUCCESS.get(command.kind)
    if event is not None:
        extra = {"heartbeat_deadline": None} if event == "terminate" else {}
        move_job(command.job_id, event, **extra)


def acknowledge_command(
    job_id: int,
    command_id: int,
    *,
    status: str,
    result: dict | None = None,
    error: str = "",
    rank: int | None = None,
) -> Command:
    """Record the job's answer to a command. Acknowledging twice is harmless. ``rank``: one
    rank's answer; a multi-rank job's command is done only when every rank answered the same
    step (breakers.control.acks), and stays deliverable to the others until then."""
    with transaction.atomic():
        # The job's row first, then the command's: the order of heartbeats and metrics
        # replies (job, then the commands they mark delivered), so they cannot deadlock. The
        # lock also counts the ranks' acknowledgements of one command one after another.
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        command = Command.objects.filter(pk=command_id, job_id=job_id).first()
        if command is None or job is None:
            # Another job's command is as invisible as a missing one: 404, never 403.
            raise NotFound(f"The job has no command {command_id}.")
        if command.status in DONE_COMMAND_STATUSES:
            return command
        result = result or {}
        per_rank = counts_ranks(command, job, rank)
        if per_rank:
            assert rank is not None
            verdict, result, error = record_rank_ack(
                command, job, rank, status=status, result=result, error=error
            )
            if verdict.status == "waiting":
                command.refresh_from_db()
                return command
            status = verdict.status
        _settle(command, per_rank, status=status, result=result, error=error)
    return command


def _settle(command: Command, per_rank: bool, *, status: str, result: dict, error: str) -> None:
    """The command's final answer as compare-and-swap, and what follows from it, in the
    caller's transaction; the loser of a race records nothing."""
    won = compare_and_swap(
        Command,
        command.pk,
        table=COMMAND_TRANSITIONS,
        expected=[CommandStatus.PENDING, CommandStatus.DELIVERED, CommandStatus.EXPIRED],
        new=status,
        acknowledged_at=timezone.now(),
        result=result,
        error=error,
    )
    command.refresh_from_db()
    if won:
        _record_outcome(command, per_rank)


def _record_outcome(command: Command, per_rank: bool) -> None:
    job_id = command.job_id
    if command.status == CommandStatus.SUCCEEDED:
        _job_effect_on_success(command)
        if command.kind == CommandKind.CHECKPOINT_AND_PAUSE:
            record_from_acknowledgement(job_id, command.pk, command.result)
            brake_confirmed(command)
        if per_rank:
            clear_split(job_id, command.result.get("step"))
    elif command.kind == CommandKind.CHECKPOINT_AND_PAUSE:
        if command.result.get("paused") is True:
            # The save failed (disk full...) but the SDK holds anyway, without releasing: the
            # job is paused, with no new checkpoint. Left "pausing" it would look stuck.
            move_job(job_id, "paused")
        raise_failed_brake_alert(command)  # a brake that could not save pages someone
    record_acknowledged(command)
    if command.kind == CommandKind.RESUME:
        resume_answered(command)
    clear_unapplied(job_id, command.result.get("step"))
    publish_after_commit(
        job_group(job_id),
        {
            "type": "command.acknowledged",
            "command": command_payload(command),
            "status": command.status,
            "result": command.result,
            "error": command.error,
        },
    )
