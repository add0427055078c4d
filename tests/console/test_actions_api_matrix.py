"""The whole authority matrix through the HTTP API: role × action × level, every cell.

Expectations come from ``incidents.teams.authority.decide`` itself, so a pass proves that the API
and
the policy module agree cell by cell (the module's own table is tested independently in
tests/incidents/test_authority.py). The state is set up so that only the authority can refuse:
an allowed cell answers 2xx, a refused one 403 with the module's reason, and a person of
another team 404. Every attempt leaves an audit row with the same verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from breakers.control.commands import issue_command
from incidents.models import AuditEntry, EscalationRequest, Job, JobStatus, Node
from incidents.teams.authority import Action, decide
from tests.support.authz import LEVELS, ROLES, Scene, raise_alert

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: dict | None = None


def _alert_field(scene: Scene, level: str | None) -> dict:
    return {"alert_id": raise_alert(scene.job_id, level).pk} if level else {}


def view(scene: Scene, level: str | None) -> Call:
    if level is None:
        return Call("get", f"/api/v1/jobs/{scene.job_id}")
    return Call("get", f"/api/v1/alerts/{raise_alert(scene.job_id, level).pk}")


def acknowledge(scene: Scene, level: str | None) -> Call:
    return Call("post", f"/api/v1/alerts/{raise_alert(scene.job_id, level).pk}/acknowledge")


def snooze(scene: Scene, level: str | None) -> Call:
    alert = raise_alert(scene.job_id, level)
    return Call("post", f"/api/v1/alerts/{alert.pk}/snooze", {"minutes": 15})


def on_incident(verb: str, body: dict) -> Callable[[Scene, str | None], Call]:
    def make(scene: Scene, level: str | None) -> Call:
        incident_id = raise_alert(scene.job_id, level).incident_id
        return Call("post", f"/api/v1/incidents/{incident_id}/{verb}", body)

    return make


def job_command(verb: str, **extra: object) -> Callable[[Scene, str | None], Call]:
    def make(scene: Scene, level: str | None) -> Call:
        if verb == "resume":
            Job.objects.filter(pk=scene.job_id).update(status=JobStatus.PAUSED)
        if verb == "isolate-node":  # only one of the job's own nodes can be isolated
            Node.objects.get_or_create(job_id=scene.job_id, hostname=str(extra["node"]))
        body = {"reason": f"{verb} in a test", **extra, **_alert_field(scene, level)}
        return Call("post", f"/api/v1/jobs/{scene.job_id}/{verb}", body)

    return make


def confirm(scene: Scene, level: str | None) -> Call:
    # The level of a confirmation is the pause's: the system's automatic pause at ``level``,
    # or (None) a pause a person asked for.
    if level is None:
        issue_command(
            scene.job_id,
            "checkpoint_and_pause",
            reason="a person's pause",
            actor_kind="person",
            actor=scene.person("oncall"),
        )
    else:
        issue_command(scene.job_id, "checkpoint_and_pause", reason="breaker", severity=level)
    body = {"decision": "keep_paused", "reason": "looking into it"}
    return Call("post", f"/api/v1/jobs/{scene.job_id}/confirm-pause", body)


def request(scene: Scene, level: str | None) -> Call:
    body = {
        "job_id": scene.job_id,
        "command": {"kind": "checkpoint_and_pause"},
        "reason": "loss keeps climbing",
        **_alert_field(scene, level),
    }
    return Call("post", "/api/v1/escalations", body)


def decision(verb: str) -> Callable[[Scene, str | None], Call]:
    def make(scene: Scene, level: str | None) -> Call:
        alert = raise_alert(scene.job_id, level) if level else None
        now = timezone.now()
        escalation = EscalationRequest.objects.create(
            job_id=scene.job_id,
            alert=alert,
            incident_id=alert.incident_id if alert else None,
            level=level or "",
            command_kind="checkpoint_and_pause",
            reason="loss keeps climbing",
            requested_by=scene.extra("requester", "oncall"),
            requested_at=now,
            expires_at=now + timedelta(minutes=15),
        )
        return Call("post", f"/api/v1/escalations/{escalation.pk}/{verb}", {"note": "ok"})

    return make


def shifts(scene: Scene, level: str | None) -> Call:
    now = timezone.now()
    body = {
        "user_id": scene.extra("on-duty", "oncall").pk,
        "starts_at": now.isoformat(),
        "ends_at": (now + timedelta(hours=8)).isoformat(),
    }
    return Call("post", f"/api/v1/teams/{scene.team.pk}/shifts", body)


def silence(scene: Scene, level: str | None) -> Call:
    ends = timezone.now() + timedelta(hours=2)
    body = {"team_id": scene.team.pk, "ends_at": ends.isoformat(), "reason": "maintenance"}
    return Call("post", "/api/v1/silences", body)


def edit_rules(scene: Scene, level: str | None) -> Call:
    change = {
        "op": "create",
        "key": "grad-spike",
        "fields": {
            "name": "Grad norm spike",
            "layer": "stability",
            "metric": "grad_norm",
            "detector": "threshold",
            "params": {"above": 100.0},
        },
    }
    return Call("post", f"/api/v1/teams/{scene.team.pk}/rules", {"why": "x", "changes": [change]})


# action → (how to make the call at a level, the levels the API can express for it)
CASES: dict[Action, tuple[Callable[[Scene, str | None], Call], tuple]] = {
    Action.VIEW: (view, LEVELS),
    # Nothing to acknowledge without an alert: the "no alert" cell has no HTTP form.
    Action.ACKNOWLEDGE_ALERT: (acknowledge, LEVELS[1:]),
    Action.SNOOZE_ALERT: (snooze, LEVELS[1:]),
    # An incident is opened by an alert: its level is the alert's.
    Action.ASSIGN_INCIDENT: (on_incident("assign", {}), LEVELS[1:]),
    Action.NOTE_INCIDENT: (on_incident("notes", {"text": "looking"}), LEVELS[1:]),
    Action.PAUSE_JOB: (job_command("pause"), LEVELS),
    Action.CONFIRM_PAUSE: (confirm, LEVELS),
    Action.REQUEST_ESCALATION: (request, LEVELS),
    Action.APPROVE_ESCALATION: (decision("approve"), LEVELS),
    Action.REJECT_ESCALATION: (decision("reject"), LEVELS),
    Action.APPLY_MITIGATION: (
        job_command("mitigate", kind="lower_lr", params={"factor": 0.3}),
        LEVELS,
    ),
    Action.RESUME_JOB: (job_command("resume"), LEVELS),
    Action.TERMINATE_JOB: (job_command("terminate"), LEVELS),
    Action.ISOLATE_NODE: (job_command("isolate-node", node="node-3"), LEVELS),
    # Shifts concern no alert.
    Action.MANAGE_SHIFTS: (shifts, (None,)),
    # Silences concern no alert either.
    Action.MANAGE_SILENCES: (silence, (None,)),
    # Rules concern no alert.
    Action.EDIT_RULES: (edit_rules, (None,)),
}
# Actions of later issues (reviews, job creation by API, rules, drills, members, channels):
# they have no endpoint yet. When one gets an endpoint, it must join CASES.
NO_ENDPOINT_YET = {
    Action.EDIT_REVIEW,
    Action.CREATE_JOB,
    Action.RUN_DRILL,
    Action.MANAGE_MEMBERS,
    Action.MANAGE_NOTIFICATIONS,
}

CELLS = [
    pytest.param(action, level, role, id=f"{action.value}-{level or 'none'}-{role or 'stranger'}")
    for action, (_, levels) in CASES.items()
    for level in levels
    for role in (*ROLES, None)
]


def test_every_action_is_either_exercised_or_known_to_have_no_endpoint():
    assert set(CASES) | NO_ENDPOINT_YET == set(Action)
    assert not set(CASES) & NO_ENDPOINT_YET


@pytest.mark.parametrize(("action", "level", "role"), CELLS)
def test_cell(scene: Scene, action: Action, level: str | None, role: str | None):
    make_call, _ = CASES[action]
    api = scene.api(role)
    call = make_call(scene, level)
    response = getattr(api, call.method)(call.path, *([call.body] if call.body else []))
    expected = decide(role, action, level)

    if role is None:
        assert not expected.allowed
        assert response.status_code == 404, response.content
        assert response.json()["error"] == "not_found"
    elif expected.allowed:
        assert response.status_code in (200, 201, 202), response.content
    else:
        assert response.status_code == 403, response.content
        assert response.json() == {"error": "forbidden", "detail": expected.reason, "fields": {}}

    if action is not Action.VIEW:  # reading is not an attempt to act
        entry = AuditEntry.objects.filter(user=api.user).latest("at", "id")
        assert (entry.action, entry.allowed) == (action.value, expected.allowed)
        assert entry.outcome_code == ("ok" if expected.allowed else response.json()["error"])
        # A stranger's probe is recorded for the owning team too (the stranger sees a 404).
        assert (entry.team_id, entry.reason) == (scene.team.pk, expected.reason)
