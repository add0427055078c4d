"""What the control plane writes on the incident timeline, in the transition's transaction.

The pause order is fixed (docs/design.md "The control plane"): stop stepping, save, confirm,
release. The agent's acknowledgement of ``checkpoint_and_pause`` is the confirmation; its
result says where the checkpoint is, how large, how long it took, and whether the accelerators
were released.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

from breakers.executors.outcome import ExecutorOutcome
from breakers.models import Command, CommandKind, CommandStatus
from breakers.recovery.attribution import words
from breakers.recovery.reruns import reruns_of
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import append_timeline, rearm_after_resume, settle_incident
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
    if command.kind == CommandKind.RESUME and isinstance(result.get("restored_step"), int):
        step = result["restored_step"]  # training goes on from there: health counts from it

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
        _record_refused_roll_back(command, row)
        return
    _record_applied(command, incident, step, at, row)


def _record_applied(
    command: Command, incident: Incident, step: Any, at: datetime | None, row: Any
) -> None:
    """What a command the job applied means for its incident: mitigated, re-armed, settled."""
    if command.kind == CommandKind.CHECKPOINT_AND_PAUSE:
        _record_checkpoint_saved(command, incident, step, row)
        _mitigate(incident)
    elif command.kind == CommandKind.RESUME:
        _record_resumed(command, row)
        rearm_after_resume(incident.pk, step if isinstance(step, int) else None, now=at)
    elif command.kind == CommandKind.TERMINATE:
        row(TimelineKind.TERMINATED, "Training terminated")
        _mitigate(incident)
        settle_incident(command.job_id, step if isinstance(step, int) else None, now=at)
    elif command.kind in (CommandKind.LOWER_LR, CommandKind.PAUSE_DATA):
        # An acknowledged soft mitigation mitigates too: the job applied it, though
        # the training goes on; the command_acknowledged row above records it.
        _mitigate(incident)


def _record_refused_roll_back(command: Command, row: Any) -> None:
    """A roll back the job refused (a hash that did not match, a missing file): said with
    its reason, where people look, not only in the command's error."""
    params = command.params
    if command.kind != CommandKind.RESUME or not params.get("checkpoint"):
        return
    row(
        TimelineKind.NOTE,
        f"Roll back to step {params.get('step')} ({params['checkpoint']}) refused by "
        f"the job: {command.error or 'no reason given'}. The job stays paused, its "
        "pause to be confirmed again",
        {"event": "roll_back_refused", "error": command.error, "params": params},
    )


def _record_checkpoint_saved(command: Command, incident: Any, step: Any, row: Any) -> None:
    """The brake's checkpoint, labelled clean when its weights hold no update from the
    anomaly's step on; and the accelerators' release, when the job said so."""
    result = command.result
    holds = result.get("weights_step")
    through = holds if isinstance(holds, int) else step  # the updates the weights hold
    clean = isinstance(through, int) and through < incident.first_step
    row(
        TimelineKind.CHECKPOINT_SAVED,
        f"Checkpoint saved at {result.get('path', '?')} ({result.get('bytes', '?')} bytes "
        f"in {result.get('seconds', '?')} s, sha256 {result.get('sha256', '?')}); "
        + ("clean: no update from the anomaly on" if clean else "after the anomaly")
        + "; training paused",
        {
            **{key: result.get(key) for key in ("path", "bytes", "seconds", "sha256", "step")},
            "weights_step": holds,
            "clean": clean,
        },
    )
    if result.get("released"):
        row(TimelineKind.RESOURCES_RELEASED, "Accelerators released")
    for rerun in reruns_of(command):  # the SDK re-ran the refused step: the batch or the node
        row(
            TimelineKind.NOTE,
            words(rerun),
            {"event": "rerun_attribution", **asdict(rerun)},
        )


def _record_resumed(command: Command, row: Any) -> None:
    """Resumed, or rolled back and resumed: the SDK's restored step and hash are checked
    against the catalogue entry the console named."""
    result, params = command.result, command.params
    if not params.get("checkpoint"):
        row(TimelineKind.RESUMED, "Training resumed")
        return
    named = {"step": params.get("step"), "sha256": params.get("sha256")}
    reported = {"step": result.get("restored_step"), "sha256": result.get("sha256")}
    if result.get("rolled_back") and reported == named:
        row(
            TimelineKind.RESUMED,
            f"Rolled back to step {reported['step']} (sha256 {reported['sha256']}) and resumed",
            {"event": "rolled_back", "checkpoint": params.get("checkpoint"), **reported},
        )
        return
    row(
        TimelineKind.NOTE,
        f"Resumed, but the roll back was NOT confirmed: asked for step {named['step']} "
        f"(sha256 {named['sha256']}), the job reported step {reported['step']} "
        f"(sha256 {reported['sha256']})",
        {"event": "roll_back_unconfirmed", "named": named, "reported": reported},
    )


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
