"""L2 escalation requests: on-call asks for a stronger action, a manager decides.

pending → approved (the command is issued at once, ``breakers.control.escalations``) / rejected
/ expired (nobody decided within the policy time). One status column, ESCALATION_TRANSITIONS,
every change a compare-and-swap with its timeline row in the same transaction: two managers
deciding at the same moment, exactly one wins and the other gets 409.

Approving issues a command, and commands belong to ``breakers`` (which ``incidents`` never
imports): ``approve_escalation`` and ``expire_escalations`` live in
``breakers.control.escalations`` and use ``record_decision`` / ``expire_escalation`` from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.errors import Conflict, InvalidInput, NotFound
from core.nodes import is_single_node_name
from core.realtime import job_group, publish_after_commit, team_group
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import append_timeline
from incidents.models import (
    ESCALATION_TRANSITIONS,
    ActorKind,
    Alert,
    AlertStatus,
    EscalationRequest,
    EscalationStatus,
    Job,
    OnExpiry,
    TimelineKind,
)
from incidents.notifications.policy import notify_escalation_request
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import Attempt, AuditContext, audited
from incidents.teams.authority import Action, decide, decide_on_escalation
from incidents.teams.users import User, Visitor

# What may be asked for: stronger than a soft mitigation, never "resume" (not an escalation).
ESCALATION_KINDS = ("checkpoint_and_pause", "lower_lr", "pause_data", "terminate", "isolate_node")

_DECISION_ROWS: dict[str, str] = {
    EscalationStatus.APPROVED: TimelineKind.ESCALATION_APPROVED,
    EscalationStatus.REJECTED: TimelineKind.ESCALATION_REJECTED,
}


def decision_seconds() -> float:
    """Undecided this long, a request expires (and notifies the next manager)."""
    return float(settings.ESCALATION_DECISION_SECONDS)


# --- Hooks for the notifications issue ------------------------------------------------------


def notify_managers_of_request(request_id: int) -> None:
    """A new request awaits a manager's decision: chat and e-mail the team's managers.

    Called after commit of ``request_escalation``.
    """
    notify_escalation_request(request_id, expired=False)


def notify_next_manager(request_id: int) -> None:
    """The request expired undecided: tell the managers again (chat and e-mail).

    Called after commit of ``expire_escalation``.
    """
    notify_escalation_request(request_id, expired=True)


# --- Requests -------------------------------------------------------------------------------


def clean_requested_action(kind: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """The command's params, checked; InvalidInput names the field that is wrong."""
    params = dict(params or {})
    if kind not in ESCALATION_KINDS:
        raise InvalidInput(
            f"{kind!r} cannot be requested as an escalation.",
            fields={"kind": f"must be one of {', '.join(ESCALATION_KINDS)}"},
        )
    allowed_keys = {"lower_lr": {"factor"}, "isolate_node": {"node"}}.get(kind, set())
    unknown = sorted(set(params) - allowed_keys)
    if unknown:
        raise InvalidInput(
            f"{kind} takes no parameter {', '.join(unknown)}.",
            fields={f"params.{key}": "unknown parameter" for key in unknown},
        )
    if kind == "lower_lr":
        factor = params.get("factor")
        if (
            isinstance(factor, bool)
            or not isinstance(factor, int | float)
            or not math.isfinite(factor)
            or not 0 < factor < 1
        ):
            raise InvalidInput(
                "lower_lr needs a factor between 0 and 1 (the learning rate is multiplied by it).",
                fields={"params.factor": "must be a number with 0 < factor < 1"},
            )
    if kind == "isolate_node" and not str(params.get("node") or "").strip():
        raise InvalidInput("isolate_node needs a node.", fields={"params.node": "required"})
    if kind == "isolate_node" and not is_single_node_name(params["node"]):
        raise InvalidInput(
            f"{str(params['node'])[:200]!r} is not one node's name.",
            fields={
                "params.node": "must be one node's name, not a host list (no brackets, commas)"
            },
        )
    return params


def request_escalation(
    user: User,
    job_id: int,
    *,
    kind: str,
    reason: str,
    params: dict[str, Any] | None = None,
    alert_id: int | None = None,
    on_expiry: str = OnExpiry.NOTIFY,
    context: AuditContext | None = None,
    refusal: Callable[[Job, str], str | None],
) -> EscalationRequest:
    """Ask a manager to approve ``kind`` (with ``params``) on the job, for the alert.

    ``refusal(job, kind)`` says why the job could not take the command now (the control
    plane's rule, ``breakers.control.job_state.refusal``, passed in since commands are not this
    layer's): such a request is refused at once, 409 with that reason, instead of waiting for a
    manager whose approval could never be carried out."""
    with audited(user, Action.REQUEST_ESCALATION, "job", job_id, context) as attempt:
        job, alert = _job_and_alert(user, job_id, alert_id, attempt)
        level = alert.severity if alert is not None else None
        attempt.check(decide(role_in_team(user, job.team_id), Action.REQUEST_ESCALATION, level))
        params = _clean_request(kind, params, reason, on_expiry)
        if alert is not None and alert.status == AlertStatus.RESOLVED:
            raise Conflict(f"Alert {alert.pk} is resolved: there is nothing left to escalate.")
        with transaction.atomic():
            locked = Job.objects.select_for_update().get(pk=job.pk)
            why = refusal(locked, kind)
            if why is not None:
                raise Conflict(f"{why} A manager's approval could not be carried out.")
            request = _create_request(job, alert, user, kind, params, reason.strip(), on_expiry)
            _record_requested(request, user, kind, params)
            attempt.succeeded(f"escalation #{request.pk} requested: {kind}")
            publish_escalation(request, "escalation.requested")
            transaction.on_commit(lambda: notify_managers_of_request(request.pk))
    return request


def _job_and_alert(
    user: User, job_id: int, alert_id: int | None, attempt: Attempt
) -> tuple[Job, Alert | None]:
    """The job (within the user's teams) and the alert the request is about, if one is named:
    it must be that job's."""
    job = scoped_get(Job.objects, user, job_id, team_path="team_id", noun="job", attempt=attempt)
    if alert_id is None:
        return job, None
    alert = Alert.objects.filter(pk=alert_id, job=job).first()
    if alert is None:
        raise NotFound(f"Job {job.name!r} has no alert {alert_id}.")
    return job, alert


def _record_requested(
    request: EscalationRequest, user: User, kind: str, params: dict[str, Any]
) -> None:
    """The request's timeline row: who asks for what, and why."""
    _timeline(
        request,
        TimelineKind.ESCALATION_REQUESTED,
        f"Escalation #{request.pk} requested by {user}: {kind} {params or ''}".rstrip()
        + f" ({request.reason})",
        at=request.requested_at,
        actor=user,
    )


def _clean_request(
    kind: str, params: dict[str, Any] | None, reason: str, on_expiry: str
) -> dict[str, Any]:
    params = clean_requested_action(kind, params)
    if not reason.strip():
        raise InvalidInput("Say why.", fields={"reason": "must not be empty"})
    if on_expiry not in OnExpiry.values:
        raise InvalidInput(
            f"Unknown on_expiry {on_expiry!r}.",
            fields={"on_expiry": f"must be one of {', '.join(OnExpiry.values)}"},
        )
    return params


def _create_request(
    job: Job,
    alert: Alert | None,
    user: User,
    kind: str,
    params: dict[str, Any],
    reason: str,
    on_expiry: str,
) -> EscalationRequest:
    now = timezone.now()
    try:
        with transaction.atomic():
            return EscalationRequest.objects.create(
                job=job,
                alert=alert,
                incident_id=alert.incident_id if alert is not None else None,
                level=alert.severity if alert is not None else "",
                command_kind=kind,
                command_params=params,
                reason=reason,
                on_expiry=on_expiry,
                requested_by=user,
                requested_at=now,
                expires_at=now + timedelta(seconds=decision_seconds()),
            )
    except IntegrityError:
        pending = EscalationRequest.objects.filter(
            job=job, command_kind=kind, status=EscalationStatus.PENDING
        ).first()
        which = f" (#{pending.pk}, by {pending.requested_by})" if pending else ""
        raise Conflict(
            f"A {kind} request for job {job.name!r} is already pending{which}: "
            "a manager decides that one."
        ) from None


# --- Decisions ------------------------------------------------------------------------------


def scoped_request(
    user: Visitor, request_id: int, attempt: Attempt | None = None
) -> EscalationRequest:
    """The request if the user's teams may see it, else NotFound (404, never 403)."""
    return scoped_get(
        EscalationRequest.objects.select_related("job", "requested_by"),
        user,
        request_id,
        team_path="job__team_id",
        noun="escalation request",
        attempt=attempt,
    )


def check_decider(attempt: Attempt, user: User, request: EscalationRequest, action: str) -> None:
    """The authority on this decision by this person: role, and never their own request."""
    attempt.check(
        decide_on_escalation(
            role_in_team(user, request.job.team_id),
            action,
            requester_id=request.requested_by_id,
            decider_id=user.pk,
            level=request.level or None,
        )
    )


def record_decision(
    request: EscalationRequest, user: User, status: str, note: str = ""
) -> EscalationRequest:
    """pending → approved/rejected as a compare-and-swap, with its timeline row.

    Call inside the caller's transaction, then ``publish_escalation``. The loser of a race gets
    Conflict (409) naming the decision that won.
    """
    now = timezone.now()
    won = compare_and_swap(
        EscalationRequest,
        request.pk,
        table=ESCALATION_TRANSITIONS,
        expected=[EscalationStatus.PENDING],
        new=status,
        decided_by=user,
        decided_at=now,
        decision_note=note.strip(),
    )
    if not won:
        current = EscalationRequest.objects.select_related("decided_by").get(pk=request.pk)
        by = f" by {current.decided_by}" if current.decided_by else ""
        raise Conflict(f"Escalation request {request.pk} was already {current.status}{by}.")
    request.refresh_from_db()
    verb = "approved" if status == EscalationStatus.APPROVED else "rejected"
    _timeline(
        request,
        _DECISION_ROWS[status],
        f"Escalation #{request.pk} ({request.command_kind}) {verb} by {user}"
        + (f": {request.decision_note}" if request.decision_note else ""),
        at=now,
        actor=user,
    )
    return request


# --- Expiry ---------------------------------------------------------------------------------


def due_escalation_ids(now: datetime) -> list[int]:
    """Pending requests past their decision time (one indexed query)."""
    return list(
        EscalationRequest.objects.filter(
            status=EscalationStatus.PENDING, expires_at__lte=now
        ).values_list("pk", flat=True)
    )


def expire_escalation(request_id: int, now: datetime) -> EscalationRequest | None:
    """pending → expired if still undecided and due; None when it was decided meanwhile.

    Call inside the caller's transaction (which may add the automatic L3 command). Notifies the
    next manager after commit.
    """
    won = compare_and_swap(
        EscalationRequest,
        request_id,
        table=ESCALATION_TRANSITIONS,
        expected=[EscalationStatus.PENDING],
        new=EscalationStatus.EXPIRED,
        decided_at=now,
    )
    if not won:
        return None
    request = EscalationRequest.objects.select_related("job").get(pk=request_id)
    minutes = (request.expires_at - request.requested_at).total_seconds() / 60
    _timeline(
        request,
        TimelineKind.NOTE,
        f"Escalation #{request.pk} ({request.command_kind}) expired: nobody decided within "
        f"{minutes:g} min" + (" (automatic L3 pause follows)" if _auto_l3(request) else ""),
        at=now,
        actor=None,
        data={"event": "escalation_expired", "on_expiry": request.on_expiry},
    )
    publish_escalation(request, "escalation.expired")
    transaction.on_commit(lambda: notify_next_manager(request_id))
    return request


def _auto_l3(request: EscalationRequest) -> bool:
    return request.on_expiry == OnExpiry.AUTO_L3


# --- Shared ---------------------------------------------------------------------------------


def _timeline(
    request: EscalationRequest,
    kind: str,
    message: str,
    *,
    at: datetime,
    actor: User | None,
    data: dict[str, Any] | None = None,
) -> None:
    if request.incident_id is None:
        return  # a request without an incident (performance alert) has no timeline
    append_timeline(
        request.incident_id,
        kind,
        message,
        at=at,
        alert_id=request.alert_id,
        actor_kind=ActorKind.PERSON if actor is not None else ActorKind.SYSTEM,
        actor=actor,
        data={
            "escalation_id": request.pk,
            "kind": request.command_kind,
            "params": request.command_params,
            "status": request.status,
            **(data or {}),
        },
    )


def escalation_payload(request: EscalationRequest) -> dict[str, Any]:
    """The request as the console, the API and realtime messages show it."""

    def when(value: datetime | None) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": request.pk,
        "job_id": request.job_id,
        "alert_id": request.alert_id,
        "incident_id": request.incident_id,
        "level": request.level or None,
        "command": {"kind": request.command_kind, "params": request.command_params},
        "reason": request.reason,
        "on_expiry": request.on_expiry,
        "status": request.status,
        "requested_by": request.requested_by.get_username(),
        "requested_at": when(request.requested_at),
        "expires_at": when(request.expires_at),
        "decided_by": request.decided_by.get_username() if request.decided_by else None,
        "decided_at": when(request.decided_at),
        "decision_note": request.decision_note,
        "command_id": request.command_id,
    }


def publish_escalation(request: EscalationRequest, kind: str) -> None:
    """Tell the console (job and team groups) after commit; the payload is taken now."""
    job = request.job
    payload = {"type": kind, "escalation": escalation_payload(request)}
    publish_after_commit(job_group(job.pk), payload)
    publish_after_commit(team_group(job.team_id), payload)
