"""What the control plane writes on the incident timeline, in the transition's transaction.

The pause order is fixed (docs/design.md "The control plane"): stop stepping, save, confirm,
release. The agent's acknowledgement of ``checkpoint_and_pause`` is the confirmation; its
result says where the checkpoint is, how large, how long it took, and whether the accelerators
were released.
"""

from __future__ import annotations

from breakers.executors.local import ExecutorOutcome
from breakers.models import Command, CommandKind, CommandStatus
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    ACTIVE_INCIDENT_STATUSES,
    INCIDENT_TRANSITIONS,
    ActorKind,
    Incident,
    IncidentStatus,
    TimelineKind,
)


def active_incident(job_id: int) -> Incident | None:
    return Incident.objects.filter(job_id=job_id, status__in=ACTIVE_INCIDENT_STATUSES).first()


def _describe(command: Command) -> str:
    return f"{command.kind} #{command.pk}"


def record_issued(command: Command) -> None:
    incident = active_incident(command.job_id)
    if incident is None:
        return
    who = "the system" if command.issued_by_kind == ActorKind.SYSTEM else str(command.issued_by)
    append_timeline(
        incident.pk,
        TimelineKind.COMMAND_ISSUED,
        f"{_describe(command)} issued by {who}: {command.reason}",
        at=command.issued_at,
        alert_id=command.alert_id,
        actor_kind=command.issued_by_kind,
        actor=command.issued_by,
        data={
            "command_id": command.pk,
            "kind": command.kind,
            "params": command.params,
            "severity": command.severity,
        },
    )


def _mitigate(incident: Incident) -> None:
    compare_and_swap(
        Incident,
        incident.pk,
        table=INCIDENT_TRANSITIONS,
        expected=[IncidentStatus.OPEN],
        new=IncidentStatus.MITIGATED,
    )


def record_acknowledged(command: Command) -> None:
    """The agent's answer, then what it means: checkpoint saved, released, resumed, ended."""
    incident = active_incident(command.job_id)
    if incident is None:
        return
    result, at, step = command.result, command.acknowledged_at, command.result.get("step")

    def row(kind: str, message: str, data: dict | None = None) -> None:
        append_timeline(
            incident.pk,
            kind,
            message,
            at=at,
            step=step,
            actor_kind=ActorKind.AGENT,
            alert_id=command.alert_id,
            data={"command_id": command.pk, **(data or {})},
        )

    outcome = "succeeded" if command.status == CommandStatus.SUCCEEDED else "failed"
    row(
        TimelineKind.COMMAND_ACKNOWLEDGED,
        f"{_describe(command)} {outcome}" + (f": {command.error}" if command.error else ""),
        {"status": command.status, "result": result, "error": command.error},
    )
    if command.status != CommandStatus.SUCCEEDED:
        return
    if command.kind == CommandKind.CHECKPOINT_AND_PAUSE:
        row(
            TimelineKind.CHECKPOINT_SAVED,
            f"Checkpoint saved at {result.get('path', '?')} ({result.get('bytes', '?')} bytes "
            f"in {result.get('seconds', '?')} s); training paused",
            {key: result.get(key) for key in ("path", "bytes", "seconds", "sha256", "step")},
        )
        if result.get("released"):
            row(TimelineKind.RESOURCES_RELEASED, "Accelerators released")
        _mitigate(incident)
    elif command.kind == CommandKind.RESUME:
        row(TimelineKind.RESUMED, "Training resumed")
    elif command.kind == CommandKind.TERMINATE:
        row(TimelineKind.TERMINATED, "Training terminated")
        _mitigate(incident)
    elif command.kind in (CommandKind.LOWER_LR, CommandKind.PAUSE_DATA):
        # An acknowledged soft mitigation mitigates too (issue 9): the job applied it, though
        # the training goes on; the command_acknowledged row above records it.
        _mitigate(incident)


def record_executor_outcome(command: Command, outcome: ExecutorOutcome) -> None:
    """A hung job stopped (or not) from the outside: on the timeline, and the level rises."""
    incident = active_incident(command.job_id)
    if incident is None:
        return
    verdict = "stopped" if outcome.stopped else "could NOT be stopped"
    append_timeline(
        incident.pk,
        TimelineKind.TERMINATED if outcome.stopped else TimelineKind.NOTE,
        f"{_describe(command)} was not acknowledged in time; the job {verdict} by the "
        f"{outcome.executor} executor: " + "; ".join(outcome.steps or [outcome.detail]),
        alert_id=command.alert_id,
        data={"command_id": command.pk, "executor": outcome.as_dict()},
    )
    if incident.level < "L4":
        Incident.objects.filter(pk=incident.pk, level__lt="L4").update(level="L4")
        append_timeline(
            incident.pk,
            TimelineKind.SEVERITY_CHANGED,
            f"Severity changed: incident level {incident.level} → L4 (the job was hung)",
            data={"incident": {"from": incident.level, "to": "L4"}, "command_id": command.pk},
        )
    if outcome.stopped:
        _mitigate(incident)
