"""What a drill of the recovery path observed after its brake (docs/drills.md, "The recovery
path"): the verdict the console recorded, the roll back it sent, what the sandbox answered, and
how training went on. Read from the console's own records (the ``Recovery`` row, the resume
command, the catalogue, the incident's timeline, the stored loss points); the drill acts on
nothing itself. The scorecard's recovery lines judge these facts (``scorecard.recovery_lines``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

from breakers.models import Checkpoint, Command
from breakers.storage.points import StoredPoint, stored_points
from incidents.models import Job, Recovery, RecoveryStatus, TimelineEntry

# Healthy steps past the restored one that say training resumed.
RESUMED_STEPS = 10
# From the brake to the recovery's end, and then to those steps, at most (a loaded machine).
RECOVERY_WAIT = 120.0
RESUMED_WAIT = 90.0
LOSS = "loss"  # the workload's loss metric (a team's own command logs it under this name too)


def recovery_facts(
    job: Job, brake: Command | None, fault: StoredPoint, wait_until: Callable[..., Any]
) -> dict[str, Any] | None:
    """The recovery of the drill's brake, once it ended (recovered, failed, held), and the
    steps trained after it; None when no verdict was recorded for the brake. ``fault``: the
    fault's stored point (its step and time); ``wait_until``: the runner's wait."""
    if brake is None:
        return None
    rows = Recovery.objects.filter(pause_command_id=brake.pk)
    ongoing = (RecoveryStatus.DECIDED, RecoveryStatus.ROLLING_BACK)
    wait_until(lambda: rows.exclude(status__in=ongoing).exists(), "the recovery", RECOVERY_WAIT)
    recovery = rows.first()
    if recovery is None:
        return None
    resume = Command.objects.filter(pk__in=[recovery.resume_command_id]).first()
    answer = _resume_facts(resume, recovery.checkpoint_id)
    facts: dict[str, Any] = {
        "verdict": recovery.verdict,
        "status": recovery.status,
        "reasons": list(recovery.reasons),
        "decided_s": _after(recovery.decided_at, fault),
        "recorded_first": _recorded_first(recovery, resume),
        "recovery_job": recovery.job_id,
        "resume_job": resume.job_id if resume is not None else None,
        "sandbox_job": job.pk,
        "checkpoint_id": recovery.checkpoint_id,
        "checkpoint_step": recovery.checkpoint_step,
        "weights_step": _weights_step(recovery.checkpoint_id),
        "skip_steps": list(recovery.skip_steps),
        "finished_s": _after(recovery.finished_at, fault),
        "resume": answer,
    }
    restored = answer.get("restored_step")
    if recovery.status == RecoveryStatus.RECOVERED and isinstance(restored, int):
        held = max(restored, recovery.last_step)
        facts["resumed"] = _resumed_facts(job, held, fault.step, wait_until)
    return facts


def _after(when: datetime | None, fault: StoredPoint) -> float | None:
    return None if when is None else (when - fault.time).total_seconds()


def _recorded_first(recovery: Recovery, resume: Command | None) -> bool:
    """The verdict's row was written before the command that acts on it was issued: its
    timeline row comes first, and the verdict's time is not after the command's."""
    if resume is None:
        return True  # nothing acted on it
    rows = TimelineEntry.objects.filter(incident_id=recovery.incident_id).order_by("pk")
    verdict_row = rows.filter(data__event="recovery_verdict").values_list("pk", flat=True).first()
    command_row = rows.filter(data__command_id=resume.pk).values_list("pk", flat=True).first()
    if verdict_row is None or command_row is None:
        return False
    return verdict_row < command_row and recovery.decided_at <= resume.issued_at


def _weights_step(checkpoint_id: int | None) -> int | None:
    row = Checkpoint.objects.filter(pk__in=[checkpoint_id]).values("step", "weights_step").first()
    if row is None:
        return None
    return row["weights_step"] if row["weights_step"] is not None else row["step"]


def _resume_facts(resume: Command | None, checkpoint_id: int | None) -> dict[str, Any]:
    if resume is None:
        return {}
    result = resume.result or {}
    checkpoint = Checkpoint.objects.filter(pk__in=[checkpoint_id])
    sha256 = checkpoint.values_list("sha256", flat=True).first()
    return {
        "status": resume.status,
        "error": resume.error,
        "rolled_back": result.get("rolled_back") is True,
        "restored_step": result.get("restored_step"),
        "sha256_matches": sha256 is not None and result.get("sha256") == sha256,
    }


def _resumed_facts(
    job: Job, held_step: int, fault_step: int, wait_until: Callable[..., Any]
) -> dict[str, Any]:
    """Training after the roll back: the job's status, the steps past ``held_step`` (the
    restored step or the step the brake held at, whichever is later: only the resumed run
    reaches them) it logged a loss for, how many of those losses were not finite, and how many
    losses the poisoned step has (one, its NaN, unless its batch was trained on again)."""

    def trained() -> list[Any] | None:
        if not Job.objects.filter(pk=job.pk, current_step__gte=held_step + RESUMED_STEPS).exists():
            return None
        losses = stored_points(job.pk, LOSS)
        after = {p.step for p in losses if p.step > held_step}
        return losses if len(after) >= RESUMED_STEPS else None

    wait_until(trained, f"{RESUMED_STEPS} steps after the roll back", RESUMED_WAIT)
    losses = stored_points(job.pk, LOSS)
    after = [p for p in losses if p.step > held_step]
    return {
        "job_status": Job.objects.filter(pk=job.pk).values_list("status", flat=True).first(),
        "steps": len({p.step for p in after}),
        "non_finite": sum(1 for p in after if not math.isfinite(p.value)),
        "fault_step_losses": sum(1 for p in losses if p.step == fault_step),
    }
