"""Where a person's confirmation of a pause stands: decided, and what the job made of it.

A confirmation that resumes or rolls back issues a ``resume``; the job may refuse it (a
checkpoint whose hash does not match, a shard missing). The job then stays paused, and people
must see why where they look — the job page, its API, the timeline — and confirm again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Max

from breakers.models import Command, CommandKind, CommandStatus
from incidents.models import Job, PauseConfirmation, PauseDecision, job_statuses_for

# A pause can be confirmed (kept, ended, rolled back) while the job can be resumed: paused,
# or still pausing (a decision taken before the checkpoint is saved is carried out after it).
CONFIRMABLE = job_statuses_for("resume")


@dataclass(frozen=True)
class ConfirmationOutcome:
    decision: str  # PauseDecision
    checkpoint: str  # what a roll back named ("" otherwise)
    decided_by: str
    decided_at: datetime
    command_id: int | None  # the resume it issued, if any
    command_status: str | None
    error: str  # the job's reason when it refused the resume

    @property
    def refused(self) -> bool:
        """The job refused the resume or roll back: the pause stands, to be confirmed again."""
        return self.command_status == CommandStatus.FAILED

    @property
    def summary(self) -> str:
        what = PauseDecision(self.decision).label
        if self.checkpoint:
            what += f" to {self.checkpoint}"
        if self.refused:
            return f"{what} refused by the job: {self.error or 'no reason given'}"
        return f"{what}: {self.command_status or 'decided'}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "checkpoint": self.checkpoint,
            "decided_by": self.decided_by,
            "decided_at": self.decided_at.isoformat(),
            "command_id": self.command_id,
            "command_status": self.command_status,
            "error": self.error,
            "refused": self.refused,
            "summary": self.summary,
        }


def pause_confirmation(pause_command_id: int) -> ConfirmationOutcome | None:
    """The pause's confirmation and its resume's outcome; None while nobody confirmed it."""
    confirmation = (
        PauseConfirmation.objects.filter(pause_command_id=pause_command_id)
        .select_related("decided_by")
        .first()
    )
    if confirmation is None:
        return None
    command = (
        Command.objects.filter(pk=confirmation.command_id).only("status", "error").first()
        if confirmation.command_id is not None
        else None
    )
    return ConfirmationOutcome(
        decision=confirmation.decision,
        checkpoint=confirmation.checkpoint,
        decided_by=confirmation.decided_by.get_username(),
        decided_at=confirmation.decided_at,
        command_id=confirmation.command_id,
        command_status=command.status if command is not None else None,
        error=command.error if command is not None else "",
    )


def pauses_awaiting_confirmation(jobs: Iterable[Job]) -> dict[int, Command]:
    """Per job id: the job's latest pause while it awaits a person's confirmation — the job
    can still be confirmed (``CONFIRMABLE``), and nobody confirmed the pause yet or the job
    refused what they decided. The one rule the pages, the
    API and ``confirm_pause`` share; three queries for any number of jobs."""
    confirmable = [job.pk for job in jobs if job.status in CONFIRMABLE]
    if not confirmable:
        return {}
    latest = (
        Command.objects.filter(job_id__in=confirmable, kind=CommandKind.CHECKPOINT_AND_PAUSE)
        .values("job_id")
        .annotate(last=Max("pk"))
        .values("last")
    )
    pauses = {pause.pk: pause for pause in Command.objects.filter(pk__in=latest)}
    decided = dict(
        PauseConfirmation.objects.filter(pause_command_id__in=pauses).values_list(
            "pause_command_id", "command_id"
        )
    )
    refused = set(
        Command.objects.filter(
            pk__in=[c for c in decided.values() if c is not None], status=CommandStatus.FAILED
        ).values_list("pk", flat=True)
    )
    return {
        pause.job_id: pause
        for pk, pause in pauses.items()
        if pk not in decided or decided[pk] in refused
    }


def pause_awaiting_confirmation(job: Job) -> Command | None:
    """The job's pause awaiting confirmation, if any (``pauses_awaiting_confirmation``)."""
    return pauses_awaiting_confirmation([job]).get(job.pk)
