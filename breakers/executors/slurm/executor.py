"""The Slurm executor: the console acting on a job and its nodes through the scheduler.

Every call runs a Slurm client (``scancel``, ``scontrol``, ``squeue``) as a subprocess and is
written on the incident's timeline with its command line, exit status and output; polls of a
job's state are summed up in one row rather than one row per poll. A call that fails raises the
incident to L4 and notifies (``notify_scheduler_failure``): a brake that did not take hold must
never go unnoticed.

Deliberately absent: ``scontrol suspend``. It is SIGSTOP and hands the job's CPUs to other jobs
(the node is oversubscribed on resume), so it is no safe pause; ``checkpoint_and_pause`` stays
the job's own business.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction

from breakers.control.timeline import active_incident
from breakers.executors.outcome import ExecutorOutcome
from breakers.executors.slurm.client import SlurmCall, run_slurm, seconds_since
from breakers.executors.targets import register
from breakers.models import ExecutorKind, SchedulerBinding
from core.errors import ServiceError
from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    ACTIVE_INCIDENT_STATUSES,
    ActorKind,
    Incident,
    Job,
    TimelineKind,
)
from incidents.notifications.policy import notify_incident_people
from incidents.teams.users import User

log = logging.getLogger(__name__)

POLL_SECONDS = 0.2
# The timeouts are settings (BRAKELINE_SLURM_COMMAND_TIMEOUT_SECONDS, 30 s, and
# BRAKELINE_SLURM_CANCEL_WAIT_SECONDS, 40 s: scancel sends SIGTERM, then SIGKILL after the
# cluster's KillWait, 30 s by default).
GONE = "GONE"  # squeue no longer knows the job: it ended long enough ago to be purged
UNKNOWN = "UNKNOWN"  # Slurm could not be asked
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
        GONE,
    }
)


class SchedulerFailed(ServiceError):
    status = 502
    code = "scheduler_failed"


# --- The timeline ----------------------------------------------------------------------------


@dataclass
class CallLog:
    """Where the calls of one action are recorded: an incident's timeline (or only here)."""

    incident_id: int | None
    alert_id: int | None = None
    command_id: int | None = None
    actor: User | None = None  # the person acting (returning a node), None for the system
    escalate: bool = True  # a failure raises the incident to L4 (not when a person is present)
    calls: list[SlurmCall] = field(default_factory=list)

    @classmethod
    def for_job(
        cls, job_id: int, *, command_id: int | None = None, alert_id: int | None = None
    ) -> CallLog:
        incident = active_incident(job_id)
        return cls(incident.pk if incident else None, alert_id=alert_id, command_id=command_id)

    def run(self, arguments: list[str], purpose: str) -> SlurmCall:
        call = run_slurm(arguments)
        self.record(call, purpose)
        return call

    def record(
        self, call: SlurmCall, purpose: str, *, ok: bool | None = None, polls: int | None = None
    ) -> None:
        """One row per call; ``ok`` overrides the exit status when the output says otherwise."""
        ok = call.ok if ok is None else ok
        self.calls.append(call)
        verdict = f"exit {call.returncode}" + ("" if ok else ", FAILED")
        # The message stays one readable line; the whole output is in ``data``.
        output = call.output.splitlines()[0][:160] if call.output else ""
        output = f": {output}" if output else ""
        data = {"event": "slurm_call", "purpose": purpose, "ok": ok, **call.as_data()}
        if polls is not None:
            data["polls"] = polls
        self.note(f"Slurm, {purpose}: `{call.command_line}` → {verdict}{output}", data)
        if not ok:
            scheduler_call_failed(self, call, purpose)

    def note(self, message: str, data: dict[str, Any], kind: str = TimelineKind.NOTE) -> None:
        if self.incident_id is None:
            log.info("%s (no incident to record it on)", message)
            return
        append_timeline(
            self.incident_id,
            kind,
            message,
            alert_id=self.alert_id,
            actor_kind=ActorKind.PERSON if self.actor is not None else ActorKind.SYSTEM,
            actor=self.actor,
            data={"scheduler": ExecutorKind.SLURM, "command_id": self.command_id, **data},
        )


def scheduler_call_failed(call_log: CallLog, call: SlurmCall, purpose: str) -> None:
    """A Slurm call failed: logged, the incident raised to L4, and notified after commit."""
    log.error(
        "Slurm call failed (%s): %s → %s %s",
        purpose,
        call.command_line,
        call.returncode,
        call.output,
    )
    incident_id = call_log.incident_id
    if incident_id is not None and call_log.escalate:
        _raise_to_l4(incident_id, f"Slurm could not {purpose}")
    failure = {"purpose": purpose, **call.as_data()}
    transaction.on_commit(lambda: notify_scheduler_failure(incident_id, failure))


def _raise_to_l4(incident_id: int, why: str) -> None:
    with transaction.atomic():
        incident = Incident.objects.select_for_update(no_key=True).get(pk=incident_id)
        if incident.status not in ACTIVE_INCIDENT_STATUSES or incident.level >= "L4":
            return
        Incident.objects.filter(pk=incident_id).update(level="L4")
        append_timeline(
            incident_id,
            TimelineKind.SEVERITY_CHANGED,
            f"Severity changed: incident level {incident.level} → L4 ({why})",
            data={"incident": {"from": incident.level, "to": "L4"}, "scheduler": "slurm"},
        )


def notify_scheduler_failure(incident_id: int | None, failure: dict[str, Any]) -> None:
    """A Slurm call failed: page the job's on-call and managers (phone and chat).

    Called after commit with the incident (None when the job had none) and the failed call
    (purpose, command line, exit status, output). It also logs at ERROR, so the failure reaches
    the operators' logs when the team has no notification policy either.
    """
    log.error(
        "NOTIFY: Slurm failed on incident %s: %s (%s)",
        incident_id,
        failure["command_line"],
        failure["purpose"],
    )
    if incident_id is not None:
        notify_incident_people(
            incident_id,
            f"L4 Slurm could not {failure['purpose']} — the brake did not take hold",
            f"Command: {failure['command_line']} (exit {failure['exit_status']})\n"
            f"Error: {str(failure.get('stderr', ''))[:500]}",
        )


# --- Slurm operations --------------------------------------------------------------------------


def job_state(slurm_job_id: str) -> tuple[str, SlurmCall]:
    """The Slurm job's state (RUNNING, COMPLETING, CANCELLED, …), GONE once Slurm purged it,
    UNKNOWN when Slurm could not be asked."""
    call = run_slurm(["squeue", "-h", "-j", slurm_job_id, "--states=all", "-o", "%T"])
    if call.ok:
        lines = call.stdout.split()
        return (lines[0] if lines else GONE), call
    if "invalid job id" in call.stderr.lower():
        return GONE, call
    return UNKNOWN, call


def wait_until_ended(slurm_job_id: str, seconds: float, call_log: CallLog, purpose: str) -> str:
    """Poll the job's state until it ended or ``seconds`` passed; one timeline row for all."""
    deadline, polls = time.monotonic() + seconds, 0
    while True:
        state, call = job_state(slurm_job_id)
        polls += 1
        if state in ENDED_STATES or state == UNKNOWN or time.monotonic() >= deadline:
            break
        time.sleep(POLL_SECONDS)
    purpose = f"{purpose}: job {slurm_job_id} is {state}"
    call_log.record(call, purpose, ok=state != UNKNOWN, polls=polls)
    return state


class SlurmExecutor:
    """Stops a hung Slurm job: USR1 to let it checkpoint, the grace, then ``scancel``."""

    name: str = ExecutorKind.SLURM

    def stop(self, job: Job, *, grace_seconds: float) -> ExecutorOutcome:
        started = time.monotonic()
        binding = SchedulerBinding.objects.filter(job_id=job.pk).first()
        if binding is None or not binding.slurm_job_id:
            return ExecutorOutcome(self.name, False, detail="The job never reported a Slurm job.")
        slurm_id, call_log = binding.slurm_job_id, CallLog.for_job(job.pk)
        state, _ = job_state(slurm_id)
        if state in ENDED_STATES:
            return ExecutorOutcome(self.name, True, [f"Slurm job {slurm_id} had ended ({state})"])
        # --batch reaches only the batch script; a process inside an srun step (it reported a
        # step id) is reached by --full, which signals every step and the batch script.
        verdict = verified_job(call_log, job.pk, slurm_id, "stop the hung job")
        if not verdict.ok:
            why = f"refused: {verdict.why}" if verdict.reachable else verdict.why
            return ExecutorOutcome(self.name, False, detail=why)
        scope = "--full" if binding.slurm_step_id else "--batch"
        steps = []
        call = call_log.run(["scancel", scope, "--signal=USR1", slurm_id], "signal USR1")
        steps.append(f"`{call.command_line}` → exit {call.returncode}")
        if call.ok:
            state = wait_until_ended(slurm_id, grace_seconds, call_log, "grace after USR1")
        if state not in ENDED_STATES:
            steps.append(f"still {state} after {grace_seconds:g} s grace")
            state = cancel(slurm_id, call_log)
        stopped = state in ENDED_STATES
        steps.append(f"Slurm job {slurm_id} {'ended: ' if stopped else 'is still '}{state}")
        return ExecutorOutcome(self.name, stopped, steps, seconds=seconds_since(started))


def cancel(slurm_id: str, call_log: CallLog) -> str:
    """``scancel`` the job and wait until Slurm says it ended; its final state."""
    state, _ = job_state(slurm_id)
    if state in ENDED_STATES:
        return state
    call = call_log.run(["scancel", slurm_id], "cancel the job")
    if not call.ok:
        return state
    wait = float(settings.SLURM_CANCEL_WAIT_SECONDS)
    return wait_until_ended(slurm_id, wait, call_log, "after scancel")


def drain(slurm_node: str, reason: str, call_log: CallLog) -> bool:
    """Drain the node with the reason, then check Slurm shows it draining (``scontrol update``
    of a node can answer 0 without having changed it)."""
    call = call_log.run(
        ["scontrol", "update", f"nodename={slurm_node}", "state=drain", f"reason={reason}"],
        f"drain node {slurm_node}",
    )
    if not call.ok:
        return False
    state, reason_shown, check = node_state(slurm_node)
    drained = check.ok and "DRAIN" in state and reason_shown.startswith(reason)
    call_log.record(check, f"check node {slurm_node} drains: it is {state or '?'}", ok=drained)
    return drained


def node_state(slurm_node: str) -> tuple[str, str, SlurmCall]:
    """The node's state (``IDLE+DRAIN``, …) and reason, from ``scontrol show node``."""
    call = run_slurm(["scontrol", "show", "node", "-o", slurm_node])
    fields = dict(_fields(call.stdout)) if call.ok else {}
    return fields.get("State", ""), fields.get("Reason", ""), call


def _fields(line: str) -> Iterator[tuple[str, str]]:
    # "Key=value Key=value …"; Reason is last and may hold spaces: "Reason=brakeline: X [root@t]"
    head, _, reason = line.partition(" Reason=")
    for word in head.split():
        key, _, value = word.partition("=")
        yield key, value
    if reason:
        yield "Reason", reason.strip()


def requeue(slurm_id: str, call_log: CallLog) -> bool:
    return call_log.run(["scontrol", "requeue", slurm_id], f"requeue job {slurm_id}").ok


def resume_node(slurm_node: str, call_log: CallLog) -> SlurmCall:
    return call_log.run(
        ["scontrol", "update", f"nodename={slurm_node}", "state=resume"],
        f"return node {slurm_node} to service",
    )


# --- Is this Slurm job the Brakeline job's? ------------------------------------------------------
#
# A heartbeat's ``slurm_job_id`` and its nodes are the agent's word, and an agent can say anything.
# Before the console binds a job to a Slurm job, and again before it cancels or drains anything,
# it asks Slurm (``scontrol show job``): the Slurm job must exist, carry the Brakeline job's id
# (submitted with ``--comment=brakeline:<job id>`` or ``--job-name=brakeline-<job id>``), and run
# on the nodes the agent reports. A node is drained only when it is in that Slurm job's nodes.


@dataclass(frozen=True)
class SlurmJob:
    """What ``scontrol show job`` says of one Slurm job."""

    slurm_job_id: str
    state: str
    name: str
    comment: str
    nodelist: str  # "" while it runs nowhere (pending)

    def carries(self, job_id: int) -> bool:
        """The Slurm job was submitted for Brakeline job ``job_id``."""
        marks = self.comment.replace(",", " ").split()
        return self.name == f"brakeline-{job_id}" or f"brakeline:{job_id}" in marks


_SHOW_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def _show_fields(line: str) -> dict[str, str]:
    """``Key=value Key=value …`` of ``scontrol show -o``; a value runs to the next `` Key=``
    (Comment may hold spaces); the first occurrence of a key wins."""
    marks = list(_SHOW_FIELD.finditer(line))
    fields: dict[str, str] = {}
    for index, mark in enumerate(marks):
        end = marks[index + 1].start() if index + 1 < len(marks) else len(line)
        fields.setdefault(mark.group(1), line[mark.end() : end].strip())
    return fields


def show_job(slurm_job_id: str) -> tuple[SlurmJob | None, SlurmCall]:
    """The Slurm job (None when Slurm does not know it, or could not be asked: see the call)."""
    call = run_slurm(["scontrol", "show", "job", "-o", slurm_job_id])
    lines = call.stdout.splitlines() if call.ok else []
    fields = _show_fields(lines[0]) if lines else {}
    if fields.get("JobId") != slurm_job_id:
        return None, call
    comment = fields.get("Comment", "")
    nodelist = fields.get("NodeList", "")
    return (
        SlurmJob(
            slurm_job_id=slurm_job_id,
            state=fields.get("JobState", ""),
            name=fields.get("JobName", ""),
            comment="" if comment == "(null)" else comment,
            nodelist="" if nodelist in ("(null)", "None assigned") else nodelist,
        ),
        call,
    )


@dataclass(frozen=True)
class Verdict:
    """Whether the console may treat ``slurm_job_id`` as the Brakeline job's."""

    slurm_job: SlurmJob | None
    why: str = ""  # why not ("" when it may)
    reachable: bool = True  # False: Slurm could not be asked (a failure, not a refusal)
    calls: tuple[SlurmCall, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.why


def verify_slurm_job(job_id: int, slurm_job_id: str, *, nodelist: str | None = None) -> Verdict:
    """Ask Slurm whether ``slurm_job_id`` is Brakeline job ``job_id``'s: it exists, carries the
    job's id in its comment or name, and (when given) runs on ``nodelist``."""
    slurm_job, call = show_job(slurm_job_id)
    if slurm_job is None:
        if call.ok or "invalid job id" in call.stderr.lower():
            return Verdict(None, f"Slurm knows no job {slurm_job_id}", calls=(call,))
        return Verdict(
            None, f"Slurm could not be asked about job {slurm_job_id}", False, calls=(call,)
        )
    if not slurm_job.carries(job_id):
        return Verdict(
            slurm_job,
            f"Slurm job {slurm_job_id} ({slurm_job.name!r}) was not submitted for Brakeline job "
            f"{job_id}: neither its comment carries brakeline:{job_id} nor is its name "
            f"brakeline-{job_id}",
            calls=(call,),
        )
    if nodelist is not None and nodelist != slurm_job.nodelist:
        return Verdict(
            slurm_job,
            f"Slurm job {slurm_job_id} runs on {slurm_job.nodelist or 'no node'}, not on the "
            f"reported {nodelist or 'no node'}",
            calls=(call,),
        )
    return Verdict(slurm_job, calls=(call,))


def verified_job(call_log: CallLog, job_id: int, slurm_job_id: str, purpose: str) -> Verdict:
    """Right before acting: is the Slurm job still the Brakeline job's? The check's call is on
    the timeline, and so is a refusal; a Slurm that cannot be asked is a failure (raised to L4,
    notified) like any failed call."""
    verdict = verify_slurm_job(job_id, slurm_job_id)
    for call in verdict.calls:
        call_log.record(
            call, f"check Slurm job {slurm_job_id} is job {job_id}'s", ok=verdict.reachable
        )
    if not verdict.ok and verdict.reachable:
        refused(call_log, purpose, verdict.why)
    return verdict


def refused(call_log: CallLog, purpose: str, why: str) -> None:
    call_log.note(
        f"Slurm, {purpose}: refused: {why}",
        {"event": "slurm_refused", "purpose": purpose, "why": why},
    )


register(
    ExecutorKind.SLURM.value,
    __name__,
    acts_on="the Slurm job Slurm itself says was submitted for the Brakeline job",
    check="slurm.verified_job",
)
