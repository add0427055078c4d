"""The on-call engineer's night over HTTP: a one-click pause and its reason given afterwards,
acknowledging an incident at once, taking or assigning it, its notes thread (on the timeline,
in the review and its exports), and snoozing one alert's pages."""

from __future__ import annotations

import pytest

from breakers.models import Command
from incidents.models import Alert, AuditEntry, Incident, TimelineEntry
from tests.support.authz import raise_alert

pytestmark = pytest.mark.django_db


# --- One-click pause ---------------------------------------------------------------------------


def test_a_pause_needs_no_reason_and_the_reason_can_be_added_afterwards(scene):
    alert = raise_alert(scene.job_id, "L2")
    oncall = scene.api("oncall")
    response = oncall.post(f"/api/v1/jobs/{scene.job_id}/pause", {})
    assert response.status_code == 202, response.content
    command = Command.objects.get(pk=response.json()["command"]["id"])
    assert command.reason == f"one-click pause by {oncall.user}"
    later = oncall.post(f"/api/v1/jobs/{scene.job_id}/pause/reason", {"reason": "loss spiked"})
    assert later.status_code == 200, later.content
    assert later.json()["command"]["id"] == command.pk
    audit = AuditEntry.objects.get(action="pause_job", outcome__startswith="reason for pause")
    assert (audit.user, audit.target_id) == (oncall.user, scene.job_id)
    assert audit.outcome == f"reason for pause #{command.pk}: loss spiked"
    row = TimelineEntry.objects.get(incident_id=alert.incident_id, data__event="pause_reason")
    assert (row.actor, row.alert_id) == (oncall.user, None)
    assert "loss spiked" in row.message
    assert Command.objects.get(pk=command.pk).reason == command.reason  # sent as it was


def test_adding_a_pause_reason_is_refused_to_viewers_without_a_pause_or_empty(scene):
    viewer = scene.api("viewer")
    url = f"/api/v1/jobs/{scene.job_id}/pause/reason"
    assert scene.api("oncall").post(url, {"reason": "why"}).status_code == 409  # no pause yet
    scene.api("oncall").post(f"/api/v1/jobs/{scene.job_id}/pause", {})
    assert viewer.post(url, {"reason": "why"}).status_code == 403
    empty = scene.api("oncall").post(url, {"reason": ""})
    assert empty.status_code == 400 and "reason" in empty.json()["fields"]
    assert scene.api(None).post(url, {"reason": "why"}).status_code == 404


# --- Acknowledging an incident -------------------------------------------------------------------


def test_one_acknowledgement_answers_every_firing_alert_of_the_incident(scene):
    nan = raise_alert(scene.job_id, "L3", rule_key="loss-nan")
    guard = raise_alert(scene.job_id, "L3", rule_key="step-guard")
    assert nan.incident_id == guard.incident_id
    oncall = scene.api("oncall")
    response = oncall.post(f"/api/v1/incidents/{nan.incident_id}/acknowledge", {"note": "on it"})
    assert response.status_code == 200, response.content
    assert sorted(a["id"] for a in response.json()["acknowledged"]) == sorted([nan.pk, guard.pk])
    statuses = Alert.objects.filter(pk__in=[nan.pk, guard.pk]).values_list("status", flat=True)
    assert set(statuses) == {"acknowledged"}
    rows = TimelineEntry.objects.filter(incident_id=nan.incident_id, kind="acknowledged")
    assert sorted(rows.values_list("alert_id", flat=True)) == sorted([nan.pk, guard.pk])
    assert all(r.actor == oncall.user and "on it" in r.message for r in rows)
    audit = AuditEntry.objects.get(target_type="incident", target_id=nan.incident_id)
    assert audit.action == "acknowledge_alert" and audit.outcome_code == "ok"
    again = oncall.post(f"/api/v1/incidents/{nan.incident_id}/acknowledge", {})
    assert again.status_code == 409


def test_acknowledging_an_incident_leaves_what_another_acknowledged_and_checks_who(scene):
    first = raise_alert(scene.job_id, "L2")
    second = raise_alert(scene.job_id, "L3")
    manager = scene.api("manager")
    assert manager.post(f"/api/v1/alerts/{first.pk}/acknowledge", {}).status_code == 200
    url = f"/api/v1/incidents/{first.incident_id}/acknowledge"
    assert scene.api("viewer").post(url, {}).status_code == 403
    assert scene.api(None).post(url, {}).status_code == 404
    response = scene.api("oncall").post(url, {})
    assert [a["id"] for a in response.json()["acknowledged"]] == [second.pk]
    by = TimelineEntry.objects.get(alert_id=first.pk, kind="acknowledged").actor
    assert by == manager.user  # not rewritten


# --- Ownership and notes ------------------------------------------------------------------------


def test_take_and_assign_an_incident_to_a_member_who_may_act(scene):
    incident_id = raise_alert(scene.job_id, "L3").incident_id
    oncall, manager = scene.api("oncall"), scene.api("manager")
    url = f"/api/v1/incidents/{incident_id}/assign"
    taken = oncall.post(url, {})
    assert taken.status_code == 200, taken.content
    assert (taken.json()["assignee"], taken.json()["assignee_id"]) == (
        oncall.user.username,
        oncall.user.pk,
    )
    handed = oncall.post(url, {"user_id": manager.user.pk})
    assert handed.json()["assignee"] == manager.user.username
    assert Incident.objects.get(pk=incident_id).assignee == manager.user
    rows = TimelineEntry.objects.filter(incident_id=incident_id, data__event="incident_assigned")
    assert [r.message for r in rows] == [
        f"Taken by {oncall.user}",
        f"Assigned to {manager.user} by {oncall.user} (was {oncall.user})",
    ]
    viewer = scene.person("viewer")
    refused = oncall.post(url, {"user_id": viewer.pk})  # a viewer cannot act on it
    assert refused.status_code == 400 and "user_id" in refused.json()["fields"]
    stranger = scene.person(None)
    assert oncall.post(url, {"user_id": stranger.pk}).status_code == 400
    assert scene.api("viewer").post(url, {}).status_code == 403
    assert AuditEntry.objects.filter(action="assign_incident", outcome_code="ok").count() == 2


def test_notes_are_a_signed_thread_on_the_timeline_in_the_review_and_its_exports(scene):
    incident_id = raise_alert(scene.job_id, "L3").incident_id
    oncall = scene.api("oncall")
    url = f"/api/v1/incidents/{incident_id}/notes"
    written = oncall.post(url, {"text": "restarted node 7's NCCL, watching"})
    assert written.status_code == 201, written.content
    assert written.json()["author"] == oncall.user.username
    oncall.post(url, {"text": "loss back to normal"})
    thread = scene.api("viewer").get(url).json()
    assert [n["text"] for n in thread] == [
        "restarted node 7's NCCL, watching",
        "loss back to normal",
    ]
    assert scene.api("viewer").post(url, {"text": "x"}).status_code == 403
    assert oncall.post(url, {"text": "  "}).status_code == 400
    assert scene.api(None).get(url).status_code == 404
    markdown = oncall.get(f"/api/v1/incidents/{incident_id}/review.md")
    assert b"restarted node 7's NCCL, watching" in markdown.content
    document = oncall.get(f"/api/v1/incidents/{incident_id}/review.json").json()
    assert any("loss back to normal" in str(row) for row in document["timeline"])


# --- Snoozing one alert ------------------------------------------------------------------------


def test_snoozing_an_alert_is_bounded_and_for_firing_alerts_only(scene):
    alert = raise_alert(scene.job_id, "L3")
    oncall = scene.api("oncall")
    url = f"/api/v1/alerts/{alert.pk}/snooze"
    for bad in (0, 241, "soon", None):
        response = oncall.post(url, {"minutes": bad})
        assert response.status_code == 400 and "minutes" in response.json()["fields"], bad
    assert scene.api("viewer").post(url, {"minutes": 15}).status_code == 403
    response = oncall.post(url, {"minutes": 60})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "firing" and response.json()["snoozed_until"]
    alert.refresh_from_db()
    assert alert.snoozed_by == oncall.user
    row = TimelineEntry.objects.get(alert=alert, data__event="alert_snoozed")
    assert "60 min" in row.message and row.actor == oncall.user
    scene.api("oncall").post(f"/api/v1/alerts/{alert.pk}/acknowledge", {})
    assert oncall.post(url, {"minutes": 15}).status_code == 409  # it pages no more anyway


# --- The pages ------------------------------------------------------------------------------------


def test_the_pages_show_who_handles_an_incident_its_notes_and_buttons_by_role(scene, client):
    from tests.console.test_console_pages import buttons

    incident_id = raise_alert(scene.job_id, "L3").incident_id
    raise_alert(scene.job_id, "L3")
    oncall = scene.api("oncall")
    oncall.post(f"/api/v1/incidents/{incident_id}/assign", {})
    oncall.post(f"/api/v1/incidents/{incident_id}/notes", {"text": "looking at the shard"})
    client.force_login(scene.person("viewer"))
    page = client.get(f"/incidents/{incident_id}/").content
    assert f"Handled by <b>{oncall.user}</b>".encode() in page
    assert b"looking at the shard" in page and b"note-form" not in page
    assert buttons(page) == []
    listed = client.get("/incidents/").content.decode()
    assert f'class="assignee">{oncall.user}</td>' in listed
    client.force_login(oncall.user)
    page = client.get(f"/incidents/{incident_id}/").content
    assert b"Handled by <b>you</b>" in page and b"note-form" in page
    assert buttons(page) == ["Acknowledge incident (2 alerts)", "Assign…"]
    state = client.get(f"/jobs/{scene.job_id}/?partial=state").content
    assert b"handled by you" in state
    assert buttons(state)[:2] == ["Acknowledge incident (2 alerts)", "Pause"]
