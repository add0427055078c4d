"""What the console pages show: jobs as rows that need attention, and the buttons each person
may press. The pages only render this; the server decides everything here.

Buttons come from ``incidents.teams.authority.decide`` with the person's role in the job's
team (the same answer the REST endpoints give, so a button is never shown for a 403), and from
the job's state machine (``breakers.control.job_state.ACCEPTED_IN``, ``pause_level``), so a
button is never shown for a 409 either. The browser gets each button as a URL, a fixed body
and the fields to ask for; its JavaScript holds no rule.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from breakers.checkpoints import catalogue
from breakers.control.confirmations import (
    pause_awaiting_confirmation,
    pause_confirmation,
    pauses_awaiting_confirmation,
)
from breakers.control.job_actions import added_pause_reasons, latest_pause, pause_level
from breakers.control.job_state import ACCEPTED_IN
from breakers.metrics import recent_points
from breakers.models import Command, CommandKind
from console.api.jobs import JobSerializer, visible_jobs
from console.buttons import Button
from console.incident_board import incident_buttons
from incidents import silences as silencing
from incidents.alerts.lifecycle import alert_payload
from incidents.alerts.snooze import SNOOZE_CHOICES, snoozed
from incidents.heartbeats import past_deadline
from incidents.models import (
    ACTIVE_ALERT_STATUSES,
    LIVE_JOB_STATUSES,
    Alert,
    AlertStatus,
    EscalationRequest,
    EscalationStatus,
    Incident,
    Job,
    JobStatus,
    Membership,
    TimelineEntry,
    TimelineKind,
)
from incidents.teams.access import role_in_team
from incidents.teams.authority import Action, decide, decide_on_escalation

SPARK_POINTS = 120
REASON = {"name": "reason", "label": "Reason (kept in the audit trail)", "required": True}
NOTE = {"name": "note", "label": "Reason", "required": True}
SNOOZE = {
    "name": "minutes",
    "label": "Hold its pages for (the brakes still act)",
    "required": True,
    "choices": SNOOZE_CHOICES,
}
# A choice is [value, label] or [value, label, body]: the body is merged into the request when
# that choice is picked (the escalation API takes lower_lr's factor in command.params).
LOWER_LR_FACTOR = 0.5
ESCALATE_KINDS = [
    ["checkpoint_and_pause", "Checkpoint and pause"],
    [
        "lower_lr",
        "Lower the learning rate ×0.5",
        {"command": {"params": {"factor": LOWER_LR_FACTOR}}},
    ],
    ["pause_data", "Pause data loading"],
]


def roles_by_team(user: Any) -> dict[int, str]:
    return dict(Membership.objects.filter(user=user).values_list("team_id", "role"))


def display_status(job: Job, now: datetime | None = None) -> str:
    """The job's status, or "silent" when a live job (a paused one included: its ranks
    heartbeat while they hold) is past its heartbeat deadline, as the watchdog judges it."""
    now = now or timezone.now()
    live = job.status in LIVE_JOB_STATUSES
    # The job's deadline is never later than its earliest rank's: past it, a rank may be
    # silent, and the ranks' own deadlines say (one probe of their index).
    past = live and job.heartbeat_deadline is not None and job.heartbeat_deadline < now
    if past and Job.objects.filter(past_deadline(now), pk=job.pk).exists():
        return "silent"
    return job.status


def job_buttons(role: str | None, job: Job, awaiting_pause: Command | None = None) -> list[Button]:
    """Pause / resume / terminate / confirm buttons this person may press on this job now
    (``awaiting_pause``: the job's pause awaiting confirmation, if any)."""
    base = f"/api/v1/jobs/{job.pk}"
    buttons = []
    if (
        job.status in ACCEPTED_IN[CommandKind.CHECKPOINT_AND_PAUSE]
        and decide(role, Action.PAUSE_JOB).allowed
    ):
        # One click (docs/design.md "one-click authorised pause"): the reason is added after.
        title = f"Checkpoint and pause {job.name}"
        buttons.append(Button("Pause", f"{base}/pause", "danger", title=title, now=True))
    confirms = awaiting_pause is not None and (
        decide(role, Action.CONFIRM_PAUSE, pause_level(awaiting_pause)).allowed
    )
    if confirms:
        buttons += _confirm_buttons(base, job)
    elif awaiting_pause is not None and decide(role, Action.PAUSE_JOB).allowed:
        buttons.append(_ask_a_manager_button(base, job))
    # "Confirm & resume" already resumes (and records the confirmation): one resume button.
    if not confirms:
        buttons += _resume_button(role, base, job)
    return buttons + _terminate_button(role, base, job)


def _ask_a_manager_button(base: str, job: Job) -> Button:
    return Button(
        "Ask a manager to confirm",
        f"{base}/ask-confirmation",
        "primary",
        ask=[{"name": "note", "label": "Note for the managers", "required": False}],
        title=f"Page the managers: confirm the pause of {job.name}",
    )


def _resume_button(role: str | None, base: str, job: Job) -> list[Button]:
    if job.status not in ACCEPTED_IN[CommandKind.RESUME]:
        return []
    if not decide(role, Action.RESUME_JOB).allowed:
        return []
    return [Button("Resume", f"{base}/resume", "primary", ask=[REASON], title=f"Resume {job.name}")]


def _terminate_button(role: str | None, base: str, job: Job) -> list[Button]:
    if job.status not in ACCEPTED_IN[CommandKind.TERMINATE]:
        return []
    if not decide(role, Action.TERMINATE_JOB).allowed:
        return []
    title = f"Terminate {job.name} (cannot be undone)"
    return [Button("Terminate", f"{base}/terminate", "danger", ask=[REASON], title=title)]


def _roll_back_choices(job: Job) -> list[tuple[int, str]]:
    """The catalogue's clean checkpoints, newest step first (the first is what the dialog
    preselects: the last clean one), then those after the anomaly, newest step first."""
    entries = catalogue(job.pk)  # newest step first
    entries.sort(key=lambda entry: not entry["clean"])  # stable: each group keeps its order
    return [
        (
            entry["id"],
            f"step {entry['step']} · {'clean' if entry['clean'] else 'after the anomaly'} · "
            f"{entry['reason']} · sha256 {entry['sha256'][:12]}…",
        )
        for entry in entries
    ]


def _confirm_buttons(base: str, job: Job) -> list[Button]:
    url = f"{base}/confirm-pause"
    optional = {**REASON, "required": False}
    choices = _roll_back_choices(job)
    checkpoint = {
        "name": "checkpoint",
        "label": "Checkpoint to roll back to (the job's catalogue)",
        "required": True,
        "choices": choices,
    }
    buttons = [
        Button(
            "Keep paused",
            url,
            "primary",
            {"decision": "keep_paused"},
            [optional],
            f"Confirm the pause of {job.name}: keep it paused",
        ),
        Button(
            "Confirm & resume",
            url,
            "plain",
            {"decision": "resume"},
            [optional],
            f"Confirm the pause of {job.name}: resume (a false alarm)",
        ),
    ]
    if choices:  # only checkpoints the job reported can be named
        buttons.append(
            Button(
                "Roll back…",
                url,
                "plain",
                {"decision": "roll_back"},
                [checkpoint, optional],
                f"Roll {job.name} back to a checkpoint and resume",
            )
        )
    return buttons


def alert_buttons(role: str | None, alert: Alert) -> list[Button]:
    buttons = []
    if (
        alert.status == AlertStatus.FIRING
        and decide(role, Action.ACKNOWLEDGE_ALERT, alert.severity).allowed
    ):
        buttons.append(_acknowledge_button(alert))
    if (
        alert.status == AlertStatus.FIRING
        and decide(role, Action.SNOOZE_ALERT, alert.severity).allowed
    ):
        buttons.append(_snooze_button(alert))
    open_ = alert.status in ACTIVE_ALERT_STATUSES
    if open_ and decide(role, Action.REQUEST_ESCALATION, alert.severity).allowed:
        buttons.append(_request_escalation_button(alert))
    return buttons


def _acknowledge_button(alert: Alert) -> Button:
    return Button(
        "Acknowledge",
        f"/api/v1/alerts/{alert.pk}/acknowledge",
        "primary",
        ask=[{**NOTE, "label": "Note", "required": False}],
        title=f"Acknowledge {alert.severity} {alert.rule_name}",
    )


def _snooze_button(alert: Alert) -> Button:
    return Button(
        "Snooze pages",
        f"/api/v1/alerts/{alert.pk}/snooze",
        "plain",
        ask=[SNOOZE],
        title=f"Snooze the pages of {alert.severity} {alert.rule_name} (never its brakes)",
    )


def _request_escalation_button(alert: Alert) -> Button:
    """Ask a manager to approve a stronger action on the alert's job."""
    kind = {
        "name": "command.kind",
        "label": "Action to request",
        "required": True,
        "choices": ESCALATE_KINDS,
    }
    return Button(
        "Request escalation",
        "/api/v1/escalations",
        "plain",
        {"job_id": alert.job_id, "alert_id": alert.pk},
        [kind, REASON],
        f"Ask a manager to approve an action on {alert.job.name}",
    )


def snooze_of(alert: Alert) -> dict[str, Any] | None:
    """Until when and by whom the alert's pages are snoozed, None when they are not."""
    if alert.status != AlertStatus.FIRING or not snoozed(alert):
        return None
    return {"until": alert.snoozed_until, "by": alert.snoozed_by or "someone"}


def acknowledged_by(alert_ids: list[int]) -> dict[int, str]:
    """Who acknowledged each alert (the acknowledgement's timeline row names its person)."""
    rows = TimelineEntry.objects.filter(
        alert_id__in=alert_ids, kind=TimelineKind.ACKNOWLEDGED
    ).select_related("actor")
    return {
        r.alert_id: (r.actor.get_username() if r.actor else "someone")
        for r in rows
        if r.alert_id is not None
    }


def escalation_buttons(user: Any, role: str | None, request: EscalationRequest) -> list[Button]:
    if request.status != EscalationStatus.PENDING:
        return []
    buttons = []
    for action, label, style in (
        (Action.APPROVE_ESCALATION, "Approve", "primary"),
        (Action.REJECT_ESCALATION, "Reject", "danger"),
    ):
        decision = decide_on_escalation(
            role,
            action,
            requester_id=request.requested_by_id,
            decider_id=user.pk,
            level=request.level or None,
        )
        if decision.allowed:
            verb = "approve" if action == Action.APPROVE_ESCALATION else "reject"
            buttons.append(
                Button(
                    label,
                    f"/api/v1/escalations/{request.pk}/{verb}",
                    style,
                    ask=[NOTE],
                    title=f"{label} {request.command_kind} on {request.job.name}",
                )
            )
    return buttons


def pause_progress(pause: Command | None) -> dict[str, Any] | None:
    """The latest pause as the job page shows it: issued → acknowledged with the checkpoint."""
    if pause is None:
        return None
    result = pause.result if isinstance(pause.result, dict) else {}
    confirmation = pause_confirmation(pause.pk)
    return {
        "id": pause.pk,
        "status": pause.status,
        "reason": pause.reason,
        "severity": pause.severity or None,
        "issued_by": "system" if pause.issued_by_kind == "system" else str(pause.issued_by),
        "issued_at": pause.issued_at,
        "acknowledged_at": pause.acknowledged_at,
        "path": result.get("path"),
        "bytes": result.get("bytes"),
        "seconds": result.get("seconds"),
        "error": pause.error,
        "confirmed": confirmation is not None and not confirmation.refused,
        # What was decided and what the job made of it (a refused roll back, with its reason).
        "confirmation": confirmation.as_dict() if confirmation is not None else None,
        "confirmers": who_confirms(pause),
        "issued_by_id": pause.issued_by_id,
        "step": pause_step(pause),
        "added_reasons": added_pause_reasons(pause),
    }


def pause_step(pause: Command) -> int | None:
    """The step the pause holds at: the job's checkpoint step once acknowledged, else the
    step boundary it was set for or the step it reached the job at; None before that."""
    result = pause.result if isinstance(pause.result, dict) else {}
    for step in (result.get("step"), pause.apply_at_step, pause.delivered_step):
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None


def who_confirms(pause: Command) -> str:
    """Who may confirm this pause, in words, with the names of the team's managers."""
    decision = decide(None, Action.CONFIRM_PAUSE, pause_level(pause))
    managers = ", ".join(
        Membership.objects.filter(team__jobs__pk=pause.job_id, role__in=["manager", "admin"])
        .order_by("role", "user__username")
        .values_list("user__username", flat=True)
    )
    names = f" ({managers})" if managers else ""
    if decision.required_role == "oncall":
        return f"the on-call engineer, a manager or an admin{names}"
    if decision.required_role is None:
        return "nobody: there is no pause to confirm"
    return f"a manager or an admin{names}"


def job_state(user: Any, job: Job) -> dict[str, Any]:
    """Everything the job page's status panel shows (re-rendered live on every event)."""
    role = role_in_team(user, job.team_id)
    pause = latest_pause(job.pk)
    alerts = _active_alerts(job)
    acked = acknowledged_by([a.pk for a in alerts])
    silences = (
        silencing.active()
        .filter(team_id=job.team_id)
        .filter(Q(job__isnull=True) | Q(job_id=job.pk))
        .select_related("created_by")
    )
    incident = (
        Incident.objects.filter(job=job).select_related("assignee").order_by("-opened_at").first()
    )
    escalations = EscalationRequest.objects.filter(
        job=job, status=EscalationStatus.PENDING
    ).select_related("job", "requested_by")
    return {
        "job": JobSerializer(job).data,
        "status": display_status(job),
        "role": role,
        "buttons": job_buttons(role, job, pause_awaiting_confirmation(job)),
        "pause": pause_progress(pause),
        "alerts": _alert_rows(role, alerts, acked),
        "incident": incident,
        "recovery": incident.recoveries.order_by("-pk").first() if incident else None,
        "incident_buttons": incident_buttons(user, role, incident, alerts, on_job_page=True),
        "silences": list(silences),
        "escalations": [
            {"request": r, "buttons": escalation_buttons(user, role, r)} for r in escalations
        ],
    }


def _active_alerts(job: Job) -> list[Alert]:
    """The job's firing and acknowledged alerts, the highest level and newest first."""
    return list(
        Alert.objects.filter(job=job, status__in=ACTIVE_ALERT_STATUSES)
        .select_related("job", "snoozed_by")
        .order_by("-severity", "-raised_at")
    )


def _alert_rows(
    role: str | None, alerts: list[Alert], acked: dict[int, str]
) -> list[dict[str, Any]]:
    """Each active alert of the status panel with its buttons, who acknowledged it, its snooze."""
    return [
        {
            "alert": alert_payload(a),
            "buttons": alert_buttons(role, a),
            "acknowledged_by": acked.get(a.pk),
            "snoozed": snooze_of(a),
        }
        for a in alerts
    ]


# --- The dashboard -----------------------------------------------------------------------------


def recent_loss(job_ids: list[int]) -> dict[int, list[tuple[int, float]]]:
    """The last SPARK_POINTS loss points of each job, oldest first."""
    return recent_points(job_ids, "loss", SPARK_POINTS)


def sparkline(points: list[tuple[int, float]], width: int = 120, height: int = 28) -> dict:
    """SVG coordinates of a loss sparkline; non-finite points become red marks at the top."""
    finite = [(s, v) for s, v in points if math.isfinite(v)]
    if not points:
        return {"path": "", "marks": [], "width": width, "height": height}
    first, last = points[0][0], points[-1][0]
    low = min((v for _, v in finite), default=0.0)
    high = max((v for _, v in finite), default=1.0)
    span_x, span_y = max(last - first, 1), (high - low) or 1.0

    def x(step: int) -> float:
        return round((step - first) / span_x * (width - 2) + 1, 1)

    path = " ".join(
        f"{x(s)},{round(height - 2 - (v - low) / span_y * (height - 4), 1)}" for s, v in finite
    )
    marks = [x(s) for s, v in points if not math.isfinite(v)]
    return {"path": path, "marks": marks, "width": width, "height": height}


def attention(
    status: str, open_alerts: list[Alert], awaiting_confirmation: bool, confirmer: str = ""
) -> tuple:
    """Sort key, most urgent first, with the one-line reason shown in the row (``confirmer``:
    who confirms the pause awaiting it, "on-call" or "a manager")."""
    firing = sorted(
        (a.severity for a in open_alerts if a.status == AlertStatus.FIRING), reverse=True
    )
    top = firing[0] if firing else None
    if top in ("L4", "L3"):
        return 0, f"{top} alert firing"
    if status == JobStatus.PAUSING:
        return 1, "pausing: waiting for the checkpoint"
    if awaiting_confirmation:
        return 1, f"paused: {confirmer or 'someone'} confirms keep / resume / roll back"
    if status == "silent":
        return 2, "silent: no heartbeat"
    if top == "L2":
        return 3, "L2 alert firing"
    if open_alerts:
        return 4, f"{len(open_alerts)} open alert(s)"
    order: dict[str, int] = {JobStatus.RUNNING: 5, JobStatus.PENDING: 6, JobStatus.PAUSED: 7}
    return order.get(status, 8), ""


def dashboard_rows(user: Any) -> list[dict[str, Any]]:
    """Every job of the user's teams, what needs them on top. A drill's sandbox jobs are not
    the team's work: they are on the drill's own page, marked."""
    jobs = list(visible_jobs(user).filter(drill_sandbox=False))
    roles = roles_by_team(user)
    ids = [job.pk for job in jobs]
    alerts: dict[int, list[Alert]] = {job_id: [] for job_id in ids}
    for alert in Alert.objects.filter(job_id__in=ids, status__in=ACTIVE_ALERT_STATUSES):
        alerts[alert.job_id].append(alert)
    losses = recent_loss(ids)
    awaiting = pauses_awaiting_confirmation(jobs)
    rows = []
    for job in jobs:
        status = display_status(job)
        pause = awaiting.get(job.pk)
        waiting = pause is not None
        confirmer = _who_confirms(pause) if pause is not None else ""
        rank, why = attention(status, alerts[job.pk], waiting, confirmer)
        levels = _count_by_level(alerts[job.pk])
        pause_buttons = [
            b for b in job_buttons(roles.get(job.team_id), job, pause) if b.label == "Pause"
        ]
        rows.append(
            {
                "job": JobSerializer(job).data,
                "status": status,
                "rank": rank,
                "why": why,
                "levels": levels,
                "spark": sparkline(losses[job.pk]),
                "buttons": pause_buttons,
            }
        )
    rows.sort(key=lambda r: (r["rank"], r["job"]["team"], r["job"]["name"]))
    return rows


def _who_confirms(pause: Command) -> str:
    """Who confirms a pause awaiting it: the on-call engineer when its level allows, else a
    manager."""
    level = pause_level(pause)
    return "on-call" if decide("oncall", Action.CONFIRM_PAUSE, level).allowed else "a manager"


def _count_by_level(open_alerts: list[Alert]) -> dict[str, int]:
    """How many open alerts of each level, L4 first (every level present, 0 when none)."""
    levels = {level: 0 for level in ("L4", "L3", "L2", "L1")}
    for alert in open_alerts:
        levels[alert.severity] += 1
    return levels
