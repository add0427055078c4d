"""The command side of the job's state machine (``incidents.models.JOB_EVENTS``).

Which commands a job takes in which status, and which event of the state machine a command
applies when it is issued and when the agent acknowledges it. ``issue_command`` asks
``refusal`` for every command, whoever issues it — a person, an approved escalation, a breaker,
the watchdog, a drill — so the rule exists once: a paused job is not paused again, whether the
second pause comes from a button, a new L3 alert or an escalation approved later.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from breakers.models import OPEN_COMMAND_STATUSES, Command, CommandKind
from incidents.models import FINAL_JOB_STATUSES, TRAINING_JOB_STATUSES, Job, JobStatus
from incidents.models import job_statuses_for as _from

_NOT_FINAL = tuple(status for status in JobStatus.values if status not in FINAL_JOB_STATUSES)

# In which statuses the job takes each kind of command.
ACCEPTED_IN: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        CommandKind.CHECKPOINT_AND_PAUSE: _from("pause"),
        CommandKind.RESUME: _from("resume"),
        CommandKind.TERMINATE: _from("terminate"),
        CommandKind.LOWER_LR: TRAINING_JOB_STATUSES,
        CommandKind.PAUSE_DATA: TRAINING_JOB_STATUSES,
        CommandKind.ISOLATE_NODE: _NOT_FINAL,
        CommandKind.INJECT_FAULT: TRAINING_JOB_STATUSES,
    }
)
# The event applied when the command is issued, and when the agent reports it succeeded.
ON_ISSUE: Mapping[str, str] = MappingProxyType({CommandKind.CHECKPOINT_AND_PAUSE: "pause"})
ON_SUCCESS: Mapping[str, str] = MappingProxyType(
    {
        CommandKind.CHECKPOINT_AND_PAUSE: "paused",
        CommandKind.RESUME: "resume",
        CommandKind.TERMINATE: "terminate",
    }
)
# Kinds of which one at a time may be on its way (a second would only repeat the first).
ONE_AT_A_TIME = (CommandKind.RESUME, CommandKind.TERMINATE)

_WHY: dict[str, str] = {
    CommandKind.CHECKPOINT_AND_PAUSE: "Job {name!r} is {status}: there is nothing to pause.",
    CommandKind.RESUME: "Job {name!r} is {status}, not paused: nothing to resume.",
    CommandKind.TERMINATE: "Job {name!r} is already {status}.",
    CommandKind.LOWER_LR: "Job {name!r} is {status}: it is not training.",
    CommandKind.PAUSE_DATA: "Job {name!r} is {status}: it is not training.",
    CommandKind.ISOLATE_NODE: "Job {name!r} is {status}.",
    CommandKind.INJECT_FAULT: "Job {name!r} is {status}: it is not training.",
}


def refusal(job: Job, kind: str) -> str | None:
    """Why ``job`` (locked by the caller) cannot take a ``kind`` command now, or None."""
    if kind == CommandKind.INJECT_FAULT and not job.drill_sandbox:
        # Faults go to drill sandboxes only (breakers.drills); the SDK checks it once more.
        return f"Job {job.name!r} is not a drill sandbox: it takes no injected fault."
    if job.status in FINAL_JOB_STATUSES:
        return f"Job {job.name!r} is {job.status}; it takes no more commands."
    if job.status not in ACCEPTED_IN[kind]:
        return _WHY[kind].format(name=job.name, status=job.status)
    if kind in ONE_AT_A_TIME:
        open_command = (
            Command.objects.filter(job_id=job.pk, kind=kind, status__in=OPEN_COMMAND_STATUSES)
            .order_by("-pk")
            .first()
        )
        if open_command is not None:
            return (
                f"Job {job.name!r} already has a {kind} on its way "
                f"(#{open_command.pk}, {open_command.status})."
            )
    return None
