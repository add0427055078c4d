"""The control plane: issuing commands to jobs and delivering them.

Every command — an automatic L3 brake, an on-call engineer's pause button, an approved L2
escalation, a drill — goes through ``issue_command``. A command is a stored record with an
idempotency key; it is pushed to the job's websocket after commit and also returned in every
heartbeat and metrics reply until it is acknowledged, so a job with no websocket still gets it.
The job's answer is recorded by ``breakers.control.acknowledge``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from breakers.control.apply_at import apply_at_step_for
from breakers.control.hearing import heard_until
from breakers.control.job_state import ON_ISSUE, refusal
from breakers.control.payload import command_payload
from breakers.control.timeline import (
    active_incident,
    record_executor_outcome,
    record_issued,
)
from breakers.executors.outcome import ExecutorOutcome
from breakers.executors.scheduler import executor_for, route_to_scheduler
from breakers.models import (
    COMMAND_TRANSITIONS,
    OPEN_COMMAND_STATUSES,
    Command,
    CommandAck,
    CommandKind,
    CommandStatus,
)
from breakers.recovery.progress import person_commanded
from core.errors import Conflict, InvalidInput
from core.realtime import agent_group, job_group, publish_after_commit
from core.text import fit
from core.transitions import compare_and_swap, compare_and_swap_all
from incidents.alerts.lifecycle import settle_incident
from incidents.jobs import move_job
from incidents.models import (
    ActorKind,
    Job,
)

IDEMPOTENCY_KEY_LENGTH = Command._meta.get_field("idempotency_key").max_length or 200


@dataclass(frozen=True)
class IssuedCommand:
    command: Command
    created: bool  # False: the idempotency key named a command issued before


def acknowledgement_deadline_seconds(kind: str) -> float:
    """COMMAND_ACK_TIMEOUT_SECONDS (env BRAKELINE_COMMAND_ACK_TIMEOUT_SECONDS), per kind."""
    return float(settings.COMMAND_ACK_TIMEOUT_SECONDS[kind])


def _job_effect_on_issue(command: Command) -> None:
    if command.kind in ON_ISSUE:
        move_job(command.job_id, ON_ISSUE[command.kind])


def issue_command(
    job_id: int,
    kind: str,
    *,
    reason: str,
    actor_kind: str = ActorKind.SYSTEM,
    actor: Any = None,
    params: dict | None = None,
    severity: str = "",
    idempotency_key: str | None = None,
    alert_id: int | None = None,
) -> IssuedCommand:
    """Store a command for the job (once per idempotency key) and push it after commit."""
    _check_kind_and_reason(kind, reason)
    now = timezone.now()
    # Fit to its column by construction (a long node name is the agent's choice).
    key = fit(idempotency_key or f"{actor_kind}:{kind}:{now.timestamp()}", IDEMPOTENCY_KEY_LENGTH)
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=job_id)
        existing = _earlier_or_refused(job, kind, key)
        if existing is not None:
            return IssuedCommand(existing, created=False)
        issued = _insert_once(
            job,
            kind,
            key,
            now,
            params=params or {},
            severity=severity,
            reason=reason.strip(),
            issued_by_kind=actor_kind,
            issued_by=actor,
            alert_id=alert_id,
        )
        if issued.created:
            _after_issue(issued.command)
    return issued


def _earlier_or_refused(job: Job, kind: str, key: str) -> Command | None:
    """The command issued before under this key; else None, unless the job refuses it."""
    existing = Command.objects.filter(job_id=job.pk, idempotency_key=key).first()
    if existing is not None:
        return existing
    # The one place where the job's state decides whether it takes a command, for every
    # issuer alike (breakers.control.job_state): checked under the job's row lock, so two
    # issuers racing each other cannot both pass it.
    why = refusal(job, kind)
    if why is not None:
        raise Conflict(why)
    return None


def _insert_once(job: Job, kind: str, key: str, now: datetime, **given: Any) -> IssuedCommand:
    """The command's row, due for acknowledgement by its kind's deadline; or the one another
    worker stored under the same key meanwhile."""
    try:
        with transaction.atomic():
            command = Command.objects.create(
                job_id=job.pk,
                kind=kind,
                idempotency_key=key,
                issued_at=now,
                deliver_by=now + timedelta(seconds=acknowledgement_deadline_seconds(kind)),
                # Multi-rank jobs: every rank applies it at this one step.
                apply_at_step=apply_at_step_for(job, kind),
                **given,
            )
    except IntegrityError:
        # Another worker issued the same key between our check and our insert.
        return IssuedCommand(Command.objects.get(job_id=job.pk, idempotency_key=key), False)
    return IssuedCommand(command, created=True)


def _check_kind_and_reason(kind: str, reason: str) -> None:
    if kind not in CommandKind.values:
        raise InvalidInput(
            f"Unknown command {kind!r}.",
            fields={"kind": f"must be one of {', '.join(CommandKind.values)}"},
        )
    if not reason.strip():
        raise InvalidInput("A command needs a reason.", fields={"reason": "must not be empty"})


def _after_issue(command: Command) -> None:
    """In the issuing transaction: the job's state, the timeline, the scheduler, and the
    pushes to the agent and the job page once it commits."""
    _job_effect_on_issue(command)
    record_issued(command)
    if command.issued_by_kind == ActorKind.PERSON:
        incident = active_incident(command.job_id)
        person_commanded(command, incident.pk if incident is not None else None)
    route_to_scheduler(command)  # Slurm-bound jobs: drains and L4 cancels go there too
    payload = command_payload(command)
    job_id = command.job_id
    publish_after_commit(agent_group(job_id), {"type": "agent.command", "command": payload})
    publish_after_commit(job_group(job_id), {"type": "command.issued", "command": payload})


def mark_delivered(command_ids: list[int]) -> int:
    """pending → delivered for these commands (no-op for any already further along)."""
    if not command_ids:
        return 0
    return compare_and_swap_all(
        Command.objects.filter(pk__in=command_ids),
        table=COMMAND_TRANSITIONS,
        expected=[CommandStatus.PENDING],
        new=CommandStatus.DELIVERED,
        delivered_at=timezone.now(),
        delivered_step=Subquery(Job.objects.filter(pk=OuterRef("job_id")).values("current_step")),
    )


# Is anything open for the job? Asked on every heartbeat and batch of every rank, and the
# answer is almost always no: one plain statement on the (job, status) index, without the
# ORM's query building (which cost more than the query itself), before the full query below.
_ANY_OPEN_SQL = (
    f"SELECT 1 FROM {Command._meta.db_table} WHERE job_id = %s AND status IN "
    f"({', '.join(['%s'] * len(OPEN_COMMAND_STATUSES))}) LIMIT 1"
)


def _any_open(job_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(_ANY_OPEN_SQL, [job_id, *map(str, OPEN_COMMAND_STATUSES)])
        return cursor.fetchone() is not None


def deliverable_commands(job_id: int, rank: int | None = None) -> list[dict[str, Any]]:
    """Open commands of the job, oldest first, marked delivered (they are being sent now).
    A multi-rank command is open until every rank acked it; ``rank`` (a heartbeat's) leaves
    out the ones that rank has acked already."""
    return deliverable_to_each(job_id, [rank])[rank]


def deliverable_to_each(
    job_id: int, ranks: Iterable[int | None]
) -> dict[int | None, list[dict[str, Any]]]:
    """``deliverable_commands`` for several ranks at once (a node's bundle answers its ranks
    together): one look at the open commands and their acknowledgements for all of them."""
    wanted = set(ranks)
    if not _any_open(job_id):
        return {rank: [] for rank in wanted}
    commands = list(
        Command.objects.filter(job_id=job_id, status__in=OPEN_COMMAND_STATUSES).order_by("pk")
    )
    acked = set(
        CommandAck.objects.filter(
            command__in=[c.pk for c in commands], rank__in=[r for r in wanted if r is not None]
        ).values_list("command_id", "rank")
    )
    owed = {rank: [c for c in commands if (c.pk, rank) not in acked] for rank in wanted}
    sent = {c.pk for each in owed.values() for c in each}
    mark_delivered([c.pk for c in commands if c.status == CommandStatus.PENDING and c.pk in sent])
    return {rank: [command_payload(c) for c in each] for rank, each in owed.items()}


STOP_ON_EXPIRY = (CommandKind.CHECKPOINT_AND_PAUSE, CommandKind.TERMINATE)


def expire_overdue_commands(now: datetime | None = None) -> list[int]:
    """Open commands past their deadline → expired; returns the ones whose job must be stopped.

    One indexed query finds them; each expiry is a compare-and-swap, so two watchdog runs
    racing each other expire (and stop) a command once.
    """
    # Up to the console's last beacon: an acknowledgement it could not hear is not late.
    heard = heard_until(now or timezone.now())
    overdue = Command.objects.filter(
        status__in=OPEN_COMMAND_STATUSES, deliver_by__lte=heard
    ).values_list("pk", "kind")
    to_stop = []
    for command_id, kind in overdue:
        won = compare_and_swap(
            Command,
            command_id,
            table=COMMAND_TRANSITIONS,
            expected=OPEN_COMMAND_STATUSES,
            new=CommandStatus.EXPIRED,
        )
        if won and kind in STOP_ON_EXPIRY:
            to_stop.append(command_id)
    return to_stop


def stop_hung_job(command_id: int, *, grace_seconds: float | None = None) -> ExecutorOutcome:
    """The job did not acknowledge ``command_id`` in time: stop it from the outside."""
    command = Command.objects.select_related("job").get(pk=command_id)
    grace = grace_seconds if grace_seconds is not None else settings.EXECUTOR_GRACE_SECONDS
    outcome = executor_for(command.job).stop(command.job, grace_seconds=grace)
    with transaction.atomic():
        Command.objects.filter(pk=command_id).update(
            result={**command.result, "executor": outcome.as_dict()}
        )
        record_executor_outcome(command, outcome)
        if outcome.stopped:
            move_job(command.job_id, "terminate", heartbeat_deadline=None)
            settle_incident(command.job_id, None)  # stopped: the episode is over
        publish_after_commit(
            job_group(command.job_id),
            {
                "type": "executor.finished",
                "command_id": command_id,
                "outcome": outcome.as_dict(),
            },
        )
    return outcome
