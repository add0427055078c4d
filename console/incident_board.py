"""What the incident page (and the job page's incident line) shows: who handles it, its notes
thread, and the buttons each person may press on it — decided here, by the authority, like
every other button (``console.board``)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from breakers.detection.rules import rules_for_job
from breakers.recovery.verdict import RECOVER_POLICY
from console.buttons import Button
from incidents.alerts import ownership
from incidents.models import (
    ACTIVE_INCIDENT_STATUSES,
    Alert,
    AlertStatus,
    Incident,
    Membership,
    TimelineEntry,
)
from incidents.recoveries import recoveries
from incidents.teams.access import role_in_team
from incidents.teams.authority import Action, decide


def _acknowledges_all(role: str | None, firing: list[Alert]) -> bool:
    return bool(firing) and all(
        decide(role, Action.ACKNOWLEDGE_ALERT, a.severity).allowed for a in firing
    )


def assignable_members(incident: Incident) -> list[list[Any]]:
    """[user id, name] of the team's members who may take the incident, by name."""
    members = (
        Membership.objects.filter(team_id=incident.job.team_id)
        .select_related("user")
        .order_by("user__username")
    )
    return [
        [m.user_id, f"{m.user.get_username()} ({m.role})"]
        for m in members
        if decide(m.role, Action.ASSIGN_INCIDENT).allowed
    ]


def _recovery_in_play(incident: Incident, alerts: list[Alert]) -> bool:
    """Automatic recovery may act on this incident: it has a verdict already, or one of its
    alerts is of a rule that recovers automatically (its verdict comes once the checkpoint is
    confirmed; a person may take over before)."""
    if incident.recoveries.exists():
        return True
    keys = {a.rule_key for a in alerts if a.action == "checkpoint_and_pause"}
    if not keys:
        return False
    rules = rules_for_job(incident.job_id)
    return any(r.key in keys and r.recovery == RECOVER_POLICY for r in rules)


def incident_buttons(
    user: Any,
    role: str | None,
    incident: Incident | None,
    alerts: list[Alert],
    *,
    on_job_page: bool = False,
) -> list[Button]:
    """Acknowledge the incident (every firing alert at once), take it, assign it. On the job
    page, whose alert cards each have their own Acknowledge, the incident's acknowledgement
    is offered when more than one of its alerts fires."""
    if incident is None or incident.status not in ACTIVE_INCIDENT_STATUSES:
        return []
    base = f"/api/v1/incidents/{incident.pk}"
    firing = [a for a in alerts if a.status == AlertStatus.FIRING and a.incident_id == incident.pk]
    buttons = []
    if len(firing) > (1 if on_job_page else 0) and _acknowledges_all(role, firing):
        buttons.append(_acknowledge_incident_button(base, incident, len(firing)))
    if not decide(role, Action.ASSIGN_INCIDENT).allowed:
        return buttons
    if incident.taken_over_by_id is None and _recovery_in_play(incident, alerts):
        title = "Stop automatic recovery here: this incident's next steps are yours"
        buttons.append(Button("Take over", f"{base}/take-over", "danger", title=title, now=True))
    if incident.assignee_id != user.pk:
        title = f"Take incident #{incident.pk}"
        buttons.append(Button("Take it", f"{base}/assign", title=title, now=True))
    if not on_job_page:
        buttons.append(_assign_button(base, incident))
    return buttons


def _acknowledge_incident_button(base: str, incident: Incident, firing: int) -> Button:
    return Button(
        f"Acknowledge incident ({firing} alert{'s' if firing > 1 else ''})",
        f"{base}/acknowledge",
        "primary",
        title=f"Acknowledge every firing alert of incident #{incident.pk}",
        now=True,
    )


def _assign_button(base: str, incident: Incident) -> Button:
    who = {
        "name": "user_id",
        "label": "Team member",
        "required": True,
        "choices": assignable_members(incident),
    }
    return Button("Assign…", f"{base}/assign", ask=[who], title=f"Assign incident #{incident.pk}")


def incident_state(user: Any, incident: Incident) -> dict[str, Any]:
    """The incident page's live part: its alerts, buttons, assignee, notes and timeline."""
    role = role_in_team(user, incident.job.team_id)
    alerts = list(incident.alerts.select_related("job").order_by("-severity", "pk"))
    timeline = TimelineEntry.objects.filter(incident_id=incident.pk).select_related("actor")
    return {
        "incident": incident,
        "role": role,
        "buttons": incident_buttons(user, role, incident, alerts),
        "firing": sum(1 for a in alerts if a.status == AlertStatus.FIRING),
        "notes": ownership.notes(incident.pk),
        "recoveries": recoveries(incident.pk),
        "may_note": decide(role, Action.NOTE_INCIDENT).allowed,
        "timeline": timeline.order_by("at", "id"),
        "alerts": alerts,
        "now": timezone.now(),
    }
