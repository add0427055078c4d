"""Escalation requests, every verb the front doors call: request, approve, reject, expire.

Approving and expiring send a command (a lower_lr, a pause, an automatic L3 pause), in the same
transaction as the request's decision, and commands are ``breakers``'. The request's records —
its checks, the compare-and-swaps of its status and their timeline rows, its payload — are
``incidents.escalations``, which never imports ``breakers``.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from breakers.control.braking import system_command
from breakers.control.commands import issue_command
from breakers.control.job_state import refusal
from breakers.models import CommandKind
from incidents import escalations
from incidents.escalations import (
    check_decider,
    due_escalation_ids,
    expire_escalation,
    publish_escalation,
    record_decision,
    scoped_request,
)
from incidents.models import (
    ActorKind,
    EscalationRequest,
    EscalationStatus,
    Job,
    OnExpiry,
)
from incidents.teams.access import role_in_team
from incidents.teams.audit import SYSTEM_CONTEXT, AuditContext, audited
from incidents.teams.authority import (
    SYSTEM,
    Action,
    action_for_command,
    decide,
    decide_on_escalation,
)

logger = logging.getLogger(__name__)

AUTO_L3_LEVEL = "L3"


def request_escalation(user: Any, job_id: int, **request: Any) -> EscalationRequest:
    """Ask a manager to approve a command (``incidents.escalations.request_escalation``),
    refused at once when the job could not take it now (``job_state.refusal``): a lower_lr
    requested for a paused job would only wait for an approval that fails."""
    return escalations.request_escalation(user, job_id, refusal=refusal, **request)


def reject_escalation(
    user: Any, request_id: int, *, note: str = "", context: AuditContext | None = None
) -> EscalationRequest:
    """A manager (never the requester) says no; nothing is sent to the job."""
    with audited(user, Action.REJECT_ESCALATION, "escalation", request_id, context) as attempt:
        request = scoped_request(user, request_id, attempt)
        check_decider(attempt, user, request, Action.REJECT_ESCALATION)
        with transaction.atomic():
            request = record_decision(request, user, EscalationStatus.REJECTED, note)
            attempt.succeeded(f"escalation #{request.pk} rejected")
            publish_escalation(request, "escalation.rejected")
    return request


def approve_escalation(
    user: Any, request_id: int, *, note: str = "", context: AuditContext | None = None
) -> EscalationRequest:
    """pending → approved, and the requested command is issued at once in the approver's name
    (idempotency key ``escalation:<id>``). Never the requester's own request; the loser of two
    simultaneous decisions gets 409 and no command is sent twice."""
    with audited(user, Action.APPROVE_ESCALATION, "escalation", request_id, context) as attempt:
        request = scoped_request(user, request_id, attempt)
        role, level = role_in_team(user, request.job.team_id), request.level or None
        approval = decide_on_escalation(
            role,
            Action.APPROVE_ESCALATION,
            requester_id=request.requested_by_id,
            decider_id=user.pk,
            level=level,
        )
        if approval.allowed:
            # The command goes out in the approver's name: they must be allowed to issue it too.
            attempt.check(decide(role, action_for_command(request.command_kind), level))
        attempt.check(approval)  # last, so the audit row carries the approval's reason
        with transaction.atomic():
            request = record_decision(request, user, EscalationStatus.APPROVED, note)
            command = issue_command(
                request.job_id,
                request.command_kind,
                reason=f"Escalation #{request.pk} approved by {user}: {request.reason}",
                actor_kind=ActorKind.PERSON,
                actor=user,
                params=request.command_params,
                severity=request.level,
                idempotency_key=f"escalation:{request.pk}",
                alert_id=request.alert_id,
            ).command
            EscalationRequest.objects.filter(pk=request.pk).update(command_id=command.pk)
            request.command_id = command.pk
            attempt.succeeded(f"escalation #{request.pk} approved: {command.kind} #{command.pk}")
            publish_escalation(request, "escalation.approved")
    return request


def expire_escalations(now: datetime | None = None) -> list[int]:
    """Expire every pending request past its decision time; returns the ids expired.

    Each in its own transaction (a compare-and-swap: a manager deciding at the same moment
    wins or loses cleanly); ``on_expiry="auto_l3"`` adds the system's checkpoint_and_pause in
    that same transaction. One failing request does not hold up the others.
    """
    now = now or timezone.now()
    expired = []
    for request_id in due_escalation_ids(now):
        try:
            with transaction.atomic():
                request = expire_escalation(request_id, now)
                if request is None:
                    continue  # decided meanwhile
                if request.on_expiry == OnExpiry.AUTO_L3:
                    _automatic_pause(request)
        except Exception:
            logger.exception("escalation request %s could not be expired", request_id)
            continue
        expired.append(request_id)
    return expired


def _automatic_pause(request: EscalationRequest) -> None:
    """The system's L3 action on an undecided request: checkpoint and pause, audited. Judged
    like every system command (breakers.control.braking.system_command): a job that is already
    paused, or no longer training, gets a timeline note instead of a second pause."""
    job_id = request.job_id
    with audited(None, Action.PAUSE_JOB, "job", job_id, SYSTEM_CONTEXT) as attempt:
        attempt.team_id = Job.objects.values_list("team_id", flat=True).get(pk=job_id)
        attempt.check(decide(SYSTEM, Action.PAUSE_JOB, AUTO_L3_LEVEL))
        command = system_command(
            job_id,
            CommandKind.CHECKPOINT_AND_PAUSE,
            level=AUTO_L3_LEVEL,
            reason=f"Escalation #{request.pk} expired undecided; automatic L3 pause "
            f"({request.reason})",
            key=f"escalation:{request.pk}:expired",
            alert_id=request.alert_id,
            incident_id=request.incident_id,
        )
        if command is None:
            attempt.succeeded("nothing sent: the job does not take a pause now")
            return
        EscalationRequest.objects.filter(pk=request.pk).update(command_id=command.pk)
        attempt.succeeded(f"escalation #{request.pk} expired: {command.kind} #{command.pk}")
