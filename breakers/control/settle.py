"""Alerts of a job that ended (terminated, finished) settle: nothing is left to watch.

A heartbeat timeout, a communication failure, a straggler rank, a split command: each is about
processes that no longer exist once the job is final, and no heartbeat or point will ever come
to resolve it. Left firing, they would page and fill the dashboard for ever. Whatever way the
job ended (its acknowledgement, its last heartbeat, the executor, a retirement), the watchdog
resolves them — each with its timeline row saying why — and the incident settles with them.
Only those: the health and performance layers. A stability alert (a NaN, a rising loss, an
environment changed across a resume) says something about the training's state that stays
true after the processes are gone; it waits for a person.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from breakers.control.timeline import record_acknowledged
from breakers.detection import shadow
from breakers.executors.slurm.binding import slurm_binding
from breakers.models import (
    COMMAND_TRANSITIONS,
    OPEN_COMMAND_STATUSES,
    Command,
    CommandKind,
    CommandStatus,
)
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import resolve_alert, settle_incident
from incidents.models import ACTIVE_ALERT_STATUSES, FINAL_JOB_STATUSES, Alert, Layer

BATCH = 200  # alerts (and commands) per tick: the next tick takes the rest
# The layers whose alerts are about the job's processes (see the module's doc).
PROCESS_LAYERS = (Layer.HEALTH, Layer.PERFORMANCE)


def settle_final_jobs(now: datetime | None = None) -> int:
    """Fail the open commands and resolve the active alerts of final jobs; how many alerts
    were resolved."""
    now = now or timezone.now()
    close_open_commands(now)
    shadow.close_ended_jobs(now)  # a shadow rule's open episode ends with its job too
    firing = (
        Alert.objects.filter(
            status__in=ACTIVE_ALERT_STATUSES,
            job__status__in=FINAL_JOB_STATUSES,
            layer__in=PROCESS_LAYERS,
        )
        .order_by("pk")
        .values_list("pk", "job_id", "job__status")[:BATCH]
    )
    resolved = 0
    for alert_id, job_id, status in list(firing):
        with transaction.atomic():
            done = resolve_alert(
                alert_id,
                reason=f"the job is {status}: none of its processes is left to watch",
                now=now,
                data={"event": "job_ended"},
            )
            settle_incident(job_id, None, now=now)
        resolved += 1 if done else 0
    return resolved


def close_open_commands(now: datetime) -> int:
    """A final job's commands still open can never be applied: no process is left (an L4's
    isolate_node behind its terminate, a command to ranks that died). Failed, with why, and
    on the timeline like any answer, instead of lingering until they expire."""
    open_commands = (
        Command.objects.filter(status__in=OPEN_COMMAND_STATUSES, job__status__in=FINAL_JOB_STATUSES)
        .select_related("job")
        .order_by("pk")[:BATCH]
    )
    closed = 0
    for command in list(open_commands):
        with transaction.atomic():
            won = compare_and_swap(
                Command,
                command.pk,
                table=COMMAND_TRANSITIONS,
                expected=OPEN_COMMAND_STATUSES,
                new=CommandStatus.FAILED,
                acknowledged_at=now,
                error=_why_never_applied(command),
            )
            if won:
                command.refresh_from_db()
                record_acknowledged(command)
                closed += 1
    return closed


def _why_never_applied(command: Command) -> str:
    why = f"the job is {command.job.status}: no process is left to apply it"
    node = command.params.get("node")
    if command.kind == CommandKind.ISOLATE_NODE and node and slurm_binding(command.job_id) is None:
        why += f"; outside Slurm nothing drains {node}: take it out of service by hand"
    return why
