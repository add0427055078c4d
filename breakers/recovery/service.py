"""Automatic recovery after an L3 brake (docs/recovery.md): the verdict, recorded before it
is acted on, then the roll back that carries out a RECOVER.

The one entry is ``consider_recovery(pause_id)``, run by the task ``control.consider_recovery``
once the brake's checkpoint is confirmed (its ``checkpoint_and_pause`` succeeded). It records
the verdict (a ``Recovery`` row and its timeline row, one transaction) and, in a second one,
acts on a RECOVER: the system confirms the pause as a roll back to the catalogue's last clean
checkpoint, skipping the offending window's later batches. Only rules whose policy is
``recover`` are considered: a ``hold`` rule's brake waits for a person, as it always did.
What the job then answers (rolled back and resumed, or refused) and a person's taking over
are ``breakers.recovery.progress``'s.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from breakers.checkpoints import roll_back_params, roll_back_target
from breakers.control.commands import issue_command
from breakers.control.confirmations import CONFIRMABLE
from breakers.models import Command, CommandKind, CommandStatus
from breakers.recovery.evidence import Gathered, evidence_out, gather
from breakers.recovery.progress import finish
from breakers.recovery.verdict import RECOVER_POLICY, Verdict, decide, skip_steps, suspect
from core.errors import Conflict, InvalidInput
from core.realtime import job_group, publish_after_commit
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    RECOVERY_TRANSITIONS,
    ActorKind,
    Job,
    JobKind,
    Recovery,
    RecoveryStatus,
    TimelineKind,
)
from incidents.teams.authority import SYSTEM, Action
from incidents.teams.authority import decide as authority

VERDICT_WORDS = {
    Verdict.RECOVER: "recover automatically (roll back, skip, resume)",
    Verdict.STOP_AND_PAGE: "stop and page: the job stays paused for a person",
    Verdict.ISOLATE_AND_PAGE: "isolate the node and page: the job stays paused for a person",
    Verdict.HOLD: "hold for a person",
}


def _brake(pause_id: int) -> Command | None:
    """The automatic L3 brake this is about, once its checkpoint is confirmed."""
    pause = Command.objects.filter(pk=pause_id).select_related("job").first()
    if (
        pause is None
        or pause.kind != CommandKind.CHECKPOINT_AND_PAUSE
        or pause.status != CommandStatus.SUCCEEDED
        or pause.issued_by_kind != ActorKind.SYSTEM
        or pause.severity != "L3"
        or pause.alert_id is None
        or pause.job.kind == JobKind.INFERENCE
    ):
        return None
    return pause


def consider_recovery(pause_id: int) -> Recovery | None:
    """Record the verdict on the brake ``pause_id``, then act on it. Idempotent: one verdict
    per brake (a redelivered task finds it and only finishes what is left)."""
    pause = _brake(pause_id)
    if pause is None:
        return None
    recovery = _record_verdict(pause)
    if recovery is not None and recovery.status == RecoveryStatus.DECIDED:
        _act(recovery)
        recovery.refresh_from_db()
    return recovery


def _record_verdict(pause: Command) -> Recovery | None:
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=pause.job_id).values_list("pk").first()
        existing = Recovery.objects.filter(pause_command_id=pause.pk).first()
        if existing is not None:
            return existing
        gathered = gather(pause)
        if gathered is None or gathered.evidence.policy != RECOVER_POLICY:
            return None
        decision = decide(gathered.evidence)
        recovery = _create(pause, gathered, decision.verdict, list(decision.reasons))
        if decision.verdict != Verdict.RECOVER:
            finish(recovery, RecoveryStatus.HELD, "")
    return recovery


def _roll_back_plan(gathered: Gathered, verdict: Verdict) -> dict[str, Any]:
    """Where a RECOVER rolls back to and which batches it skips (nothing for other verdicts)."""
    evidence, checkpoint = gathered.evidence, gathered.checkpoint
    if checkpoint is None or verdict != Verdict.RECOVER:
        return {}
    return {
        "checkpoint_id": checkpoint["id"],
        "checkpoint_step": checkpoint["step"],
        "skip_steps": skip_steps(evidence.first_step, evidence.last_step, checkpoint["step"]),
    }


def _create(pause: Command, gathered: Gathered, verdict: Verdict, reasons: list[str]) -> Recovery:
    """The verdict's row and its timeline row, by the system, in the caller's transaction."""
    evidence = gathered.evidence
    rank, node = suspect(evidence)
    recovery = Recovery.objects.create(
        job_id=pause.job_id,
        incident=gathered.incident,
        alert=gathered.alert,
        pause_command_id=pause.pk,
        rule_key=evidence.rule_key,
        cause=evidence.cause,
        first_step=evidence.first_step,
        last_step=evidence.last_step,
        rank=rank,
        node=node,
        verdict=verdict,
        reasons=reasons,
        evidence=evidence_out(evidence),
        decided_at=timezone.now(),
        **_roll_back_plan(gathered, verdict),
    )
    append_timeline(
        gathered.incident.pk,
        TimelineKind.NOTE,
        f"Recovery verdict for pause #{pause.pk}: {VERDICT_WORDS[verdict]} — " + "; ".join(reasons),
        alert_id=gathered.alert.pk,
        step=evidence.last_step,
        data={
            "event": "recovery_verdict",
            "recovery_id": recovery.pk,
            "verdict": verdict.value,
            "reasons": reasons,
            "pause_command_id": pause.pk,
        },
    )
    publish_after_commit(
        job_group(pause.job_id), {"type": "incident.updated", "incident_id": gathered.incident.pk}
    )
    return recovery


def _act(recovery: Recovery) -> None:
    """The system confirms the pause as a roll back to the last clean checkpoint. Refused
    (the job moved on, a person took over, the checkpoint went away): the recovery fails with
    its reason on the timeline, and the job stays as it is for a person."""
    with transaction.atomic():
        job = Job.objects.select_for_update().get(pk=recovery.job_id)
        recovery.refresh_from_db()
        if recovery.status != RecoveryStatus.DECIDED:
            return  # a person took over meanwhile
        why = _refusal(recovery, job)
        if why is not None:
            finish(recovery, RecoveryStatus.FAILED, f"automatic roll back not requested: {why}")
            return
        try:
            with transaction.atomic():
                resume = _request_roll_back(recovery)
        except (Conflict, InvalidInput) as refused:
            finish(recovery, RecoveryStatus.FAILED, f"automatic roll back refused: {refused}")
            return
        compare_and_swap(
            Recovery,
            recovery.pk,
            table=RECOVERY_TRANSITIONS,
            expected=[RecoveryStatus.DECIDED],
            new=RecoveryStatus.ROLLING_BACK,
            resume_command_id=resume.pk,
        )


def _refusal(recovery: Recovery, job: Job) -> str | None:
    newest = (
        Command.objects.filter(job_id=job.pk, kind=CommandKind.CHECKPOINT_AND_PAUSE)
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
    )
    if job.status not in CONFIRMABLE or newest != recovery.pause_command_id:
        return f"job {job.name!r} is {job.status} and no longer held by this brake"
    allowed = authority(SYSTEM, Action.CONFIRM_PAUSE, "L3")
    return None if allowed.allowed else allowed.reason


def _request_roll_back(recovery: Recovery) -> Command:
    target = roll_back_target(recovery.job_id, str(recovery.checkpoint_id))
    params = roll_back_params(target, list(recovery.skip_steps))
    skipped = params.get("skip_steps") or []
    skipping = f", skipping the batches of steps {skipped}" if skipped else ""
    resume = issue_command(
        recovery.job_id,
        CommandKind.RESUME,
        reason=(
            f"Automatic recovery of pause #{recovery.pause_command_id}: roll back to the clean "
            f"checkpoint of step {target.step} ({target.path}){skipping}"
        ),
        params=params,
        severity="L3",
        idempotency_key=f"recovery:{recovery.pk}:resume",
        alert_id=recovery.alert_id,
    ).command
    append_timeline(
        recovery.incident_id,
        TimelineKind.NOTE,
        f"Automatic recovery: roll back to step {target.step} requested (resume #{resume.pk})"
        + skipping,
        alert_id=recovery.alert_id,
        data={
            "event": "recovery_roll_back_requested",
            "recovery_id": recovery.pk,
            "command_id": resume.pk,
            "checkpoint_id": target.pk,
            "skip_steps": skipped,
        },
    )
    return resume
