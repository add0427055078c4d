"""The notifications API: admins set the policy (refused with the paging rules' reason when it
breaks them), contacts and test messages; members read the policy, deliveries and the last
delivery per channel; escalation requests reach the managers."""

from __future__ import annotations

import json

import pytest

from breakers.control.escalations import request_escalation
from incidents.escalations import notify_managers_of_request
from incidents.models import AuditEntry, Contact, Delivery, NotificationPolicy
from incidents.notifications.delivery import attempt_delivery
from incidents.notifications.rounds import dispatch_alert
from incidents.notifications.routing import DEFAULT_RULES
from tests.support.authz import raise_alert

CHAT_ONLY_AT_L3 = [
    {"layer": "health", "min_level": "L1", "channels": ["phone", "sms"]},
    {"layer": "stability", "min_level": "L1", "channels": ["chat"]},
]


def put(api, path: str, body: dict):
    return api.client.put(
        path, json.dumps(body), content_type="application/json", headers=api.headers
    )


@pytest.mark.django_db
def test_a_policy_breaking_the_l3_rule_is_refused_with_the_reason(scene):
    admin = scene.api("admin")
    path = f"/api/v1/teams/{scene.team.pk}/notification-policy"
    response = put(admin, path, {"rules": CHAT_ONLY_AT_L3})
    assert response.status_code == 400
    assert "L3 stability alerts must go to at least two channels, one of them phone" in (
        response.content.decode()
    )
    assert NotificationPolicy.objects.get(team=scene.team).rules == DEFAULT_RULES  # unchanged
    response = put(admin, path, {"rules": DEFAULT_RULES, "chat_webhook_url": "http://x/hook"})
    assert response.status_code == 200, response.content
    assert response.json()["configured"] is True
    assert NotificationPolicy.objects.get(team=scene.team).chat_webhook_url == "http://x/hook"


@pytest.mark.django_db
def test_only_admins_change_the_policy_members_read_it(scene):
    path = f"/api/v1/teams/{scene.team.pk}/notification-policy"
    assert put(scene.api("manager"), path, {"ack_timeout_seconds": 60}).status_code == 403
    assert AuditEntry.objects.filter(action="manage_notifications", allowed=False).exists()
    body = scene.api("viewer").get(path).json()
    # A new team has the default policy, saved (incidents.teams.defaults).
    assert body["configured"] is True and body["rules"] == DEFAULT_RULES
    assert body["last_delivered"] == {"chat": None, "email": None, "sms": None, "phone": None}
    assert scene.api(None).get(path).status_code == 404


@pytest.mark.django_db
def test_test_message_contacts_deliveries_and_last_delivered(scene, receiver, settings):
    settings.NOTIFY_PROVIDER_BASE_URL = receiver.url + "/provider"
    admin = scene.api("admin")
    oncall = scene.person("oncall")
    team = f"/api/v1/teams/{scene.team.pk}"
    put(admin, f"{team}/notification-policy", {"chat_webhook_url": receiver.url + "/hook"})
    assert put(admin, f"{team}/contacts/{oncall.pk}", {"phone": "555"}).status_code == 400
    assert put(admin, f"{team}/contacts/{oncall.pk}", {"phone": "+15551234"}).status_code == 204
    assert Contact.objects.get(user=oncall).phone == "+15551234"
    response = admin.post(f"{team}/test-notification", {"user_id": oncall.pk, "channel": "sms"})
    assert response.status_code == 202 and response.json()["status"] == "queued"
    assert attempt_delivery(response.json()["id"]) is None
    assert receiver.to("/Messages.json")[0].form["To"] == "+15551234"
    alert = raise_alert(scene.job_id, "L2")
    (chat_id,) = dispatch_alert(alert.pk)
    attempt_delivery(chat_id)
    rows = scene.api("viewer").get(f"/api/v1/alerts/{alert.pk}/deliveries").json()
    assert [(r["channel"], r["status"], r["attempts"]) for r in rows] == [("chat", "delivered", 1)]
    last = scene.api("viewer").get(f"{team}/notification-policy").json()["last_delivered"]
    assert last["chat"] is not None and last["sms"] is None and last["phone"] is None


@pytest.mark.django_db
def test_an_escalation_request_is_chatted_and_mailed_to_the_managers(scene, receiver):
    NotificationPolicy.objects.filter(team=scene.team).update(
        chat_webhook_url=receiver.url + "/hook"
    )
    manager = scene.person("manager")
    manager.email = "boss@example.org"
    manager.save()
    alert = raise_alert(scene.job_id, "L2")
    request = request_escalation(
        scene.person("oncall"),
        scene.job_id,
        kind="checkpoint_and_pause",
        reason="loss climbing",
        alert_id=alert.pk,
    )
    notify_managers_of_request(request.pk)
    deliveries = Delivery.objects.filter(purpose="escalation", recipient=manager)
    assert sorted(deliveries.values_list("channel", flat=True)) == ["chat", "email"]
    assert all("escalation" in d.first_line and "awaits" in d.first_line for d in deliveries)
