"""A person's commands to a job: pause (one click), confirm a pause, resume, terminate, apply a
soft mitigation, isolate a node. Used by the REST API, and later by the web UI and websocket
consumers alike.

Every verb: scoping (another team's job is 404), then the authority (403 with its reason), then
the state, checked under the job's row lock (409 when somebody else got there first), then the
command through ``breakers.control.commands.issue_command`` with the person as actor — which writes
the
incident timeline's ``command_issued`` row in the same transaction. Every attempt is audited.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import uuid4

from django.db import IntegrityError, transaction
from django.utils import timezone

from breakers.checkpoints import roll_back_params, roll_back_target
from breakers.control.commands import issue_command
from breakers.control.confirmations import CONFIRMABLE, pause_confirmation
from breakers.control.timeline import active_incident
from breakers.executors.slurm import executor as slurm
from breakers.executors.slurm.binding import slurm_binding
from breakers.executors.slurm.client import job_nodes
from breakers.models import Checkpoint, Command, CommandKind
from core.errors import Conflict, InvalidInput, NotFound
from core.nodes import is_single_node_name
from incidents.alerts.lifecycle import append_timeline
from incidents.escalations import clean_requested_action
from incidents.models import (
    ActorKind,
    Alert,
    AuditEntry,
    Job,
    Node,
    PauseConfirmation,
    PauseDecision,
    TimelineKind,
)
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import Attempt, AuditContext, audited
from incidents.teams.authority import Action, action_for_command, decide

MITIGATIONS = (CommandKind.LOWER_LR, CommandKind.PAUSE_DATA)
NO_REASON = "one-click pause"  # a pause's reason when the person gave none (yet)
# A reason given after the pause: a pause_job audit row whose outcome starts with this.
PAUSE_REASON_PREFIX = "reason for pause #{}: "


def _job_and_alert(
    user: Any, job_id: int, alert_id: int | None, attempt: Attempt
) -> tuple[Job, Alert | None]:
    """The job (404 unless the user's team's) and the alert the action concerns, if any."""
    job = scoped_get(Job.objects, user, job_id, team_path="team_id", noun="job", attempt=attempt)
    if alert_id is None:
        return job, None
    alert = Alert.objects.filter(pk=alert_id, job_id=job.pk).first()
    if alert is None:
        raise NotFound(f"Job {job.name!r} has no alert {alert_id}.")
    return job, alert


def _issue(
    user: Any,
    job: Job,
    kind: str,
    *,
    reason: str,
    alert: Alert | None = None,
    params: dict[str, Any] | None = None,
    key: str | None = None,
) -> Command:
    return issue_command(
        job.pk,
        kind,
        reason=reason,
        actor_kind=ActorKind.PERSON,
        actor=user,
        params=params,
        severity=alert.severity if alert is not None else "",
        # A person's clicks are each a new command; the job lock and state checks refuse the
        # double click (409), so the key only has to be unique.
        idempotency_key=key or f"person:{user.pk}:{kind}:{uuid4().hex}",
        alert_id=alert.pk if alert is not None else None,
    ).command


def _locked_job(job_id: int) -> Job:
    return Job.objects.select_for_update().get(pk=job_id)


def _command_verb(
    user: Any,
    job_id: int,
    kind: str,
    *,
    reason: str,
    alert_id: int | None,
    context: AuditContext | None,
    params: Callable[[], dict[str, Any]] | None = None,
) -> Command:
    """The shared shape of every verb that issues one command (see the module doc).

    ``params`` is called after the authority answered, so a refused person learns nothing
    from validation errors."""
    action = action_for_command(kind)
    with audited(user, action, "job", job_id, context) as attempt:
        job, alert = _job_and_alert(user, job_id, alert_id, attempt)
        level = alert.severity if alert is not None else None
        attempt.check(decide(role_in_team(user, job.team_id), action, level))
        cleaned = params() if params is not None else None
        with transaction.atomic():
            # The job's state is judged by issue_command, under the job's row lock: 409 when
            # it cannot take this command now (breakers.control.job_state).
            command = _issue(user, job, kind, reason=reason, alert=alert, params=cleaned)
            attempt.succeeded(f"{command.kind} #{command.pk} issued")
    return command


def pause_job(
    user: Any,
    job_id: int,
    *,
    reason: str = "",
    alert_id: int | None = None,
    context: AuditContext | None = None,
) -> Command:
    """One click: checkpoint and pause the job, with the person as actor. The reason is
    optional (waiting for one is what a pause exists to avoid); ``add_pause_reason`` adds it
    afterwards."""

    return _command_verb(
        user,
        job_id,
        CommandKind.CHECKPOINT_AND_PAUSE,
        reason=reason.strip() or f"{NO_REASON} by {user}",
        alert_id=alert_id,
        context=context,
    )


def add_pause_reason(
    user: Any, job_id: int, *, reason: str, context: AuditContext | None = None
) -> Command:
    """The reason of the job's latest pause, said after the click: kept in the audit trail
    (which the job page reads back) and on the incident's timeline. The command itself, already
    on its way to the job, is not rewritten."""
    with audited(user, Action.PAUSE_JOB, "job", job_id, context) as attempt:
        job = scoped_get(
            Job.objects, user, job_id, team_path="team_id", noun="job", attempt=attempt
        )
        attempt.check(decide(role_in_team(user, job.team_id), Action.PAUSE_JOB))
        reason = (reason or "").strip()
        if not reason or len(reason) > 2000:
            raise InvalidInput("Say why in 1 to 2000 characters.", fields={"reason": "required"})
        pause = latest_pause(job.pk)
        if pause is None:
            raise Conflict(f"Job {job.name!r} has no pause to give a reason for.")
        with transaction.atomic():
            incident = active_incident(job.pk)
            if incident is not None:
                append_timeline(
                    incident.pk,
                    TimelineKind.NOTE,
                    f"Reason for pause #{pause.pk}, given by {user}: {reason}",
                    alert_id=pause.alert_id,
                    actor_kind=ActorKind.PERSON,
                    actor=user,
                    data={"event": "pause_reason", "pause_command_id": pause.pk},
                )
            attempt.succeeded(f"{PAUSE_REASON_PREFIX.format(pause.pk)}{reason}")
    return pause


def added_pause_reasons(pause: Command) -> list[dict[str, Any]]:
    """The reasons given after the pause, oldest first: who, when, what."""
    prefix = PAUSE_REASON_PREFIX.format(pause.pk)
    rows = AuditEntry.objects.filter(
        action=Action.PAUSE_JOB,
        target_type="job",
        target_id=pause.job_id,
        outcome_code="ok",
        outcome__startswith=prefix,
    ).select_related("user")
    return [
        {"by": str(row.user), "at": row.at, "reason": row.outcome[len(prefix) :]}
        for row in rows.order_by("at", "id")
    ]


def resume_job(
    user: Any,
    job_id: int,
    *,
    reason: str,
    alert_id: int | None = None,
    context: AuditContext | None = None,
) -> Command:
    """Resume a paused (or pausing) job."""

    return _command_verb(
        user,
        job_id,
        CommandKind.RESUME,
        reason=reason,
        alert_id=alert_id,
        context=context,
    )


def terminate_job(
    user: Any,
    job_id: int,
    *,
    reason: str,
    alert_id: int | None = None,
    context: AuditContext | None = None,
) -> Command:
    """Terminate the job (the control plane stops it from outside if it does not answer)."""

    return _command_verb(
        user,
        job_id,
        CommandKind.TERMINATE,
        reason=reason,
        alert_id=alert_id,
        context=context,
    )


def apply_mitigation(
    user: Any,
    job_id: int,
    *,
    kind: str,
    reason: str,
    params: dict[str, Any] | None = None,
    alert_id: int | None = None,
    context: AuditContext | None = None,
) -> Command:
    """A soft mitigation issued directly: lower the learning rate or pause data loading."""
    if kind not in MITIGATIONS:
        raise InvalidInput(
            f"{kind!r} is not a soft mitigation.",
            fields={"kind": f"must be one of {', '.join(MITIGATIONS)}"},
        )

    return _command_verb(
        user,
        job_id,
        kind,
        reason=reason,
        alert_id=alert_id,
        context=context,
        params=lambda: clean_requested_action(kind, params),
    )


def isolate_node(
    user: Any,
    job_id: int,
    *,
    node: str,
    reason: str,
    alert_id: int | None = None,
    context: AuditContext | None = None,
) -> Command:
    """Take one node of the job out (by hand it weighs as much as terminating).

    Only one of the job's own nodes: one name (no Slurm host list), one the job reported (its
    ``Node`` rows) or its Slurm job runs on. Another team's node is a 400 naming ``node``; the
    drain itself checks the node against Slurm again (``breakers.executors.slurm.actions``)."""

    def params() -> dict[str, Any]:
        if str(node or "").strip():  # (an empty one is refused by clean_requested_action)
            _check_node_of_job(job_id, node)
        return clean_requested_action(CommandKind.ISOLATE_NODE, {"node": node})

    return _command_verb(
        user,
        job_id,
        CommandKind.ISOLATE_NODE,
        reason=reason,
        alert_id=alert_id,
        context=context,
        params=params,
    )


def _check_node_of_job(job_id: int, node: str) -> None:
    if not is_single_node_name(node):
        raise InvalidInput(
            f"{node!r} is not one node's name.",
            fields={"node": "must be one node's name, not a host list (no brackets or commas)"},
        )
    binding = slurm_binding(job_id)
    if binding is not None:
        # On Slurm, Slurm says which nodes are the job's (a point's node is the agent's word).
        nodes = _slurm_nodes(job_id, binding.slurm_job_id)
        if nodes is not None:
            if node in nodes:
                return
            raise InvalidInput(
                f"{node} is not a node of this job: its Slurm job {binding.slurm_job_id} runs "
                f"on {', '.join(nodes) or 'no node'}.",
                fields={"node": "must be one of the job's nodes"},
            )
    if not Node.objects.filter(job_id=job_id, hostname=node).exists():
        raise InvalidInput(
            f"{node} is not a node of this job.",
            fields={"node": "must be one of the job's nodes"},
        )


def _slurm_nodes(job_id: int, slurm_job_id: str) -> list[str] | None:
    """The nodes of the job's Slurm job, as Slurm says; None when Slurm cannot say (then the
    job's Node rows decide here, and the drain checks Slurm again before it acts)."""
    verdict = slurm.verify_slurm_job(job_id, slurm_job_id)
    if not verdict.ok or verdict.slurm_job is None:
        return [] if verdict.reachable else None
    nodes, _ = job_nodes(verdict.slurm_job.nodelist)
    return nodes


# --- Confirming a pause ---------------------------------------------------------------------


def latest_pause(job_id: int) -> Command | None:
    return (
        Command.objects.filter(job_id=job_id, kind=CommandKind.CHECKPOINT_AND_PAUSE)
        .order_by("-pk")
        .first()
    )


def pause_level(pause: Command) -> str | None:
    """The level a confirmation is judged at: the automatic pause's severity (L3: on-call may
    confirm it). A pause a person asked for (directly or by an approved escalation) counts as
    "no alert": only a manager ends it (incidents.teams.authority, confirm_pause)."""
    if pause.issued_by_kind == ActorKind.SYSTEM and pause.severity:
        return pause.severity
    return None


def confirm_pause(
    user: Any,
    job_id: int,
    *,
    decision: str,
    reason: str = "",
    checkpoint: str = "",
    skip_steps: list[int] | None = None,
    context: AuditContext | None = None,
) -> PauseConfirmation:
    """Keep paused, resume, or roll back to a checkpoint of the job's catalogue (named by id
    or path; the resume carries its path, hash and step, and ``skip_steps``: later batches the
    job drops). Once per pause: a second confirmation is 409."""
    with audited(user, Action.CONFIRM_PAUSE, "job", job_id, context) as attempt:
        job = scoped_get(
            Job.objects, user, job_id, team_path="team_id", noun="job", attempt=attempt
        )
        pause = latest_pause(job.pk)
        if pause is None or job.status not in CONFIRMABLE:
            raise Conflict(f"Job {job.name!r} is {job.status}: there is no pause to confirm.")
        level = pause_level(pause)
        attempt.check(decide(role_in_team(user, job.team_id), Action.CONFIRM_PAUSE, level))
        checkpoint = _clean_confirmation(decision, checkpoint)
        target = roll_back_target(job.pk, checkpoint) if checkpoint else None
        with transaction.atomic():
            job = _locked_job(job.pk)
            newest = latest_pause(job.pk)
            if job.status not in CONFIRMABLE or newest is None or newest.pk != pause.pk:
                raise Conflict(f"Job {job.name!r} changed meanwhile ({job.status}); look again.")
            path = target.path if target is not None else ""
            confirmation = _record_confirmation(job, pause, user, decision, path, reason)
            if decision != PauseDecision.KEEP_PAUSED:
                _resume_confirmed(user, job, pause, confirmation, target, skip_steps, reason)
            _confirmation_timeline(job, pause, confirmation, user)
            attempt.succeeded(f"pause #{pause.pk} confirmed: {decision}")
    return confirmation


def _resume_confirmed(
    user: Any,
    job: Job,
    pause: Command,
    confirmation: PauseConfirmation,
    target: Checkpoint | None,
    skip_steps: list[int] | None,
    reason: str,
) -> None:
    """The resume (or roll back to ``target``) a confirmation asks for, linked to it; inside
    the confirmation's transaction."""
    params = roll_back_params(target, skip_steps) if target is not None else {}
    confirmation.command_id = _resume_after_confirmation(
        user, job, pause, params, reason, confirmation.decided_at
    ).pk
    PauseConfirmation.objects.filter(pk=confirmation.pk).update(command_id=confirmation.command_id)


def _clean_confirmation(decision: str, checkpoint: str) -> str:
    if decision not in PauseDecision.values:
        raise InvalidInput(
            f"Unknown decision {decision!r}.",
            fields={"decision": f"must be one of {', '.join(PauseDecision.values)}"},
        )
    checkpoint = (checkpoint or "").strip()
    if decision == PauseDecision.ROLL_BACK and not checkpoint:
        raise InvalidInput(
            "Rolling back needs the checkpoint to roll back to.",
            fields={"checkpoint": "required to roll back"},
        )
    if decision != PauseDecision.ROLL_BACK and checkpoint:
        raise InvalidInput(
            "A checkpoint is named only to roll back.",
            fields={"checkpoint": "only with decision roll_back"},
        )
    return checkpoint


def _record_confirmation(
    job: Job, pause: Command, user: Any, decision: str, checkpoint: str, reason: str
) -> PauseConfirmation:
    try:
        with transaction.atomic():
            return PauseConfirmation.objects.create(
                job=job,
                pause_command_id=pause.pk,
                level=pause_level(pause) or "",
                decision=decision,
                checkpoint=checkpoint,
                reason=reason.strip(),
                decided_by=user,
                decided_at=timezone.now(),
            )
    except IntegrityError:
        first = PauseConfirmation.objects.select_related("decided_by").get(
            pause_command_id=pause.pk
        )
        if _replaces_refused(first, user, decision, checkpoint, reason):
            first.refresh_from_db()
            return first
        raise Conflict(
            f"Pause #{pause.pk} was already confirmed by {first.decided_by}: {first.decision}."
        ) from None


def _replaces_refused(
    first: PauseConfirmation, user: Any, decision: str, checkpoint: str, reason: str
) -> bool:
    """The job refused the first confirmation's resume (its roll back's checkpoint did not
    check out): the pause stands, and this confirmation takes its place. The first one stays
    on the timeline and in the audit trail. A compare-and-swap on its command: of two
    confirmations at once, one wins."""
    outcome = pause_confirmation(first.pause_command_id)
    if outcome is None or not outcome.refused:
        return False
    return bool(
        PauseConfirmation.objects.filter(pk=first.pk, command_id=first.command_id).update(
            decision=decision,
            checkpoint=checkpoint,
            reason=reason.strip(),
            decided_by=user,
            decided_at=timezone.now(),
            command_id=None,
        )
    )


def _resume_after_confirmation(
    user: Any, job: Job, pause: Command, params: dict[str, Any], reason: str, at: datetime
) -> Command:
    why = reason.strip() or "pause confirmed"
    if params:
        why = f"roll back to step {params['step']} ({params['checkpoint']}): {why}"
    return _issue(
        user,
        job,
        CommandKind.RESUME,
        reason=f"Pause #{pause.pk} confirmed by {user}, {why}",
        alert=pause.alert,
        params=params,
        # One resume per confirmation: a confirmation replacing a refused one sends its own.
        key=f"confirm-pause:{pause.pk}:{at.isoformat()}",
    )


def _confirmation_timeline(
    job: Job, pause: Command, confirmation: PauseConfirmation, user: Any
) -> None:
    incident = active_incident(job.pk)
    if incident is None:
        return
    what = PauseDecision(confirmation.decision).label.lower()
    if confirmation.checkpoint:
        what += f" ({confirmation.checkpoint})"
    append_timeline(
        incident.pk,
        TimelineKind.NOTE,
        f"Pause #{pause.pk} confirmed by {user}: {what}"
        + (f" — {confirmation.reason}" if confirmation.reason else ""),
        at=confirmation.decided_at,
        alert_id=pause.alert_id,
        actor_kind=ActorKind.PERSON,
        actor=user,
        data={
            "event": "pause_confirmed",
            "pause_command_id": pause.pk,
            "decision": confirmation.decision,
            "checkpoint": confirmation.checkpoint,
            "command_id": confirmation.command_id,
        },
    )
