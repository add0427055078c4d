"""The job's answer to a command: recorded once, with its effect on the job and the timeline.

Every answer goes through ``acknowledge_command_ranks``: a node's bundle hands it its ranks'
answers to one command together (``breakers.agent.bundle``); ``acknowledge_command`` is its
one-answer case, for the agent's own acknowledgement (one per rank of a multi-rank job) and the
Slurm executor's when it carried out a routed command itself
(``breakers.executors.slurm.actions``). Issuing is ``breakers.control.commands``.

Lock order: the job's row first (``select_for_update``), then the command's (its
compare-and-swap when settled), as heartbeats and metrics replies take them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from breakers.checkpoints import record_from_acknowledgement
from breakers.control.acks import (
    RankAck,
    clear_split,
    counts_ranks,
    record_rank_acks,
    refuse_rank,
)
from breakers.control.failed_brake import raise_failed_brake_alert
from breakers.control.job_state import ON_SUCCESS
from breakers.control.payload import command_payload
from breakers.control.timeline import record_acknowledged
from breakers.control.unapplied import clear_unapplied
from breakers.models import COMMAND_TRANSITIONS, Command, CommandKind, CommandStatus
from breakers.recovery.progress import brake_confirmed, resume_answered
from core.errors import NotFound, ServiceError, or_raise
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


@dataclass(frozen=True)
class Answer:
    """One acknowledgement of a command: the job's (``rank`` None) or one rank's."""

    status: str
    result: dict = field(default_factory=dict)
    error: str = ""
    rank: int | None = None


def acknowledge_command(
    job_id: int,
    command_id: int,
    *,
    status: str,
    result: dict | None = None,
    error: str = "",
    rank: int | None = None,
) -> Command:
    """Record the job's answer to a command: ``acknowledge_command_ranks`` of one answer."""
    answer = Answer(status, result or {}, error, rank)
    return or_raise(acknowledge_command_ranks(job_id, command_id, [answer])[0])


def acknowledge_command_ranks(
    job_id: int, command_id: int, answers: Sequence[Answer]
) -> list[Command | ServiceError]:
    """Record answers to one command (a node's ranks', say), each answered on its own: the
    command, or the refusal of that answer (which writes nothing of it). Acknowledging twice
    is harmless. A multi-rank job's command is done only when every rank answered the same
    step (breakers.control.acks), and stays deliverable to the others until then. The job's
    row is locked once, the ranks' answers written in one statement and counted once, the
    command settled at most once; a missing command is NotFound, raised, for them all."""
    with transaction.atomic():
        # The job's row first, then the command's: the order of heartbeats and metrics
        # replies (job, then the commands they mark delivered), so they cannot deadlock. The
        # lock also counts the acknowledgements of one command (a node's together) one after
        # another.
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        command = Command.objects.filter(pk=command_id, job_id=job_id).first()
        if command is None or job is None:
            # Another job's command is as invisible as a missing one: 404, never 403.
            raise NotFound(f"The job has no command {command_id}.")
        outcomes: list[Command | ServiceError] = [command] * len(answers)
        if command.status in DONE_COMMAND_STATUSES:
            return outcomes
        ranked: list[RankAck] = []
        for index, answer in enumerate(answers):
            if answer.rank is None or not counts_ranks(command, job, answer.rank):
                continue
            refusal = refuse_rank(job, answer.rank)
            if refusal is not None:
                outcomes[index] = refusal
            else:
                ranked.append(RankAck(answer.rank, answer.status, answer.result, answer.error))
        whole = [a for a in answers if a.rank is None or not counts_ranks(command, job, a.rank)]
        _decide(command, job, ranked, whole[0] if whole else None)
    return outcomes


def _decide(command: Command, job: Job, ranked: list[RankAck], whole: Answer | None) -> None:
    """The ranks' answers counted, and the command settled if they make a verdict; else by
    the job's own answer, if one came (it speaks for every rank)."""
    if ranked:
        verdict, result, error = record_rank_acks(command, job, ranked)
        if verdict is not None:
            _settle(command, True, status=verdict.status, result=result, error=error)
            return
    if whole is not None:
        _settle(command, False, status=whole.status, result=whole.result, error=whole.error)


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
