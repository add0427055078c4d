"""Automatic braking: what the system does, at once, when a rule's alert is raised.

L2 → the rule's soft mitigation (lower the learning rate, pause data loading); L3 →
checkpoint_and_pause; L4 → terminate plus isolate_node for each failing node. No person is
waited for, but the system is judged as a person is: by the authority matrix (what the system
may do at the alert's level) and by the job's state (a paused job is not paused again).
Each command's idempotency key names the alert, its severity and the command, so a
redelivered evaluation or a second worker issues nothing twice.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from breakers.control.apply_at import STEP_SYNCED_KINDS, hold_gather_seconds
from breakers.control.commands import IDEMPOTENCY_KEY_LENGTH, issue_command
from breakers.control.job_state import ACCEPTED_IN
from breakers.control.replica_response import take_replica_out
from breakers.control.timeline import active_incident
from breakers.models import Command, CommandKind
from core.errors import Conflict
from core.text import fit
from incidents.alerts.lifecycle import append_timeline
from incidents.models import SYSTEM_COMMAND_REFUSED, Alert, Job, JobKind, TimelineKind
from incidents.teams.authority import SYSTEM, action_for_command, decide

SYSTEM_VERBS: dict[str, str] = {
    CommandKind.CHECKPOINT_AND_PAUSE: "pause",
    CommandKind.TERMINATE: "terminate",
}
# A rule's action → the commands that carry it out.
ACTION_COMMANDS: dict[str, tuple[str, ...]] = {
    "lower_lr": (CommandKind.LOWER_LR,),
    "pause_data": (CommandKind.PAUSE_DATA,),
    "checkpoint_and_pause": (CommandKind.CHECKPOINT_AND_PAUSE,),
    "terminate_and_isolate": (CommandKind.TERMINATE, CommandKind.ISOLATE_NODE),
}


def _failing_nodes(alert: Alert) -> list[str]:
    nodes = [node for node in (alert.nodes or []) if node]
    return nodes or ([alert.node] if alert.node else [])


def _reason(alert: Alert) -> str:
    where = f" on {alert.node}" if alert.node else ""
    return f"{alert.severity} {alert.rule_name}{where} at step {alert.step}: {alert.description}"


def system_command(
    job_id: int,
    kind: str,
    *,
    level: str,
    reason: str,
    key: str,
    alert_id: int | None = None,
    incident_id: int | None = None,
    params: dict | None = None,
) -> Command | None:
    """The system's own command, judged like a person's: the authority decides whether the
    system may do it at ``level`` (incidents.teams.authority), the job's state whether the
    job takes it now (breakers.control.job_state). A refusal is a timeline row, never an
    error: a breaker must not fail, and nothing must roll back, because a job is already
    paused. Returns the command (the one issued before, for a repeated key), or None."""
    decision = decide(SYSTEM, action_for_command(kind), level)
    why = None if decision.allowed else decision.reason
    if why is None:
        try:
            with transaction.atomic():  # a refusal must not spoil the caller's transaction
                return issue_command(
                    job_id,
                    kind,
                    reason=reason,
                    params=params,
                    severity=level,
                    idempotency_key=key,
                    alert_id=alert_id,
                ).command
        except Conflict as refused:
            why = _state_refusal(job_id, kind) or refused.detail
    _note_refused(incident_id or _incident_of(job_id), kind, level, why, alert_id)
    return None


def _note_refused(
    incident_id: int | None, kind: str, level: str, why: str | None, alert_id: int | None
) -> None:
    """The refusal on the incident's timeline, where people look (if the job has one)."""
    if incident_id is not None:
        append_timeline(
            incident_id,
            TimelineKind.NOTE,
            f"No automatic {SYSTEM_VERBS.get(kind, kind)}: {why}",
            alert_id=alert_id,
            data={"event": SYSTEM_COMMAND_REFUSED, "kind": kind, "level": level},
        )


def _state_refusal(job_id: int, kind: str) -> str | None:
    """ "job 'x' is already paused" when the job's status is what refused the command."""
    job = Job.objects.get(pk=job_id)
    if job.status in ACCEPTED_IN[kind]:
        return None  # something else refused it (one already on its way)
    return f"job {job.name!r} is already {job.status}."


def _incident_of(job_id: int) -> int | None:
    incident = active_incident(job_id)
    return incident.pk if incident is not None else None


def seconds_to_gather_holds(alert: Alert, waiting_since: datetime | None, now: datetime) -> float:
    """How long the alert's brake should still wait for the job's other ranks to hold
    (``breakers.control.apply_at``, "Gathering the holds"); 0: brake now. Only a brake named
    at one step for all ranks waits, never an inference job's (it holds no step), nor one the
    job's state would refuse anyway (a second node's alert once the job is pausing)."""
    job = alert.job
    synced = STEP_SYNCED_KINDS.intersection(ACTION_COMMANDS.get(alert.action, ()))
    if job.kind == JobKind.INFERENCE or all(job.status not in ACCEPTED_IN[k] for k in synced):
        return 0.0
    return hold_gather_seconds(job, waiting_since, now)


def brake_for_alert(alert: Alert) -> list[Command]:
    """Issue the commands the alert's rule asks for, as the system; once per alert and level."""
    if alert.severity == "L3" and alert.job.kind == JobKind.INFERENCE:
        return take_replica_out(alert)  # the inference profile: no checkpoint, a restart
    commands = []
    for kind in ACTION_COMMANDS.get(alert.action, ()):
        targets = _failing_nodes(alert) if kind == CommandKind.ISOLATE_NODE else [None]
        for node in targets:
            params = dict(alert.action_params) if kind == CommandKind.LOWER_LR else {}
            if node is not None:
                params["node"] = node
            key = fit(
                f"alert:{alert.pk}:{alert.severity}:{kind}" + (f":{node}" if node else ""),
                IDEMPOTENCY_KEY_LENGTH,
            )
            command = system_command(
                alert.job_id,
                kind,
                level=alert.severity,
                reason=_reason(alert),
                params=params,
                key=key,
                alert_id=alert.pk,
                incident_id=alert.incident_id,
            )
            if command is not None:
                commands.append(command)
    return commands
