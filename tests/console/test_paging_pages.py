"""The pages of issue 23 (server-rendered, Django's test client): paging (policy, contacts,
shifts, a test page), the "page nobody" banner, silences, incidents, audit, the nav badge.

The forms post to their pages, which call the API's own services: what the API refuses, the
page refuses with the same sentence, and nothing is half-written.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from incidents.jobs import create_job
from incidents.models import (
    AuditEntry,
    Contact,
    Delivery,
    EscalationRequest,
    Membership,
    NotificationPolicy,
    OnCallShift,
    Silence,
)
from incidents.notifications.delivery import attempt_delivery
from tests.support.authz import raise_alert

pytestmark = pytest.mark.django_db


@pytest.fixture
def crew():
    job = create_job("vision", "vit-huge").job
    users = get_user_model().objects
    people = {}
    for name, role in (("ana", "admin"), ("max", "manager"), ("olga", "oncall"), ("vic", "viewer")):
        people[name] = users.create(username=name, email=f"{name}@example.org")
        Membership.objects.create(user=people[name], team=job.team, role=role)
    return job, people


def banner(html: bytes) -> list[str]:
    found = re.findall(r'<div class="banner paging-nobody"[^>]*>(.*?)</div>', html.decode(), re.S)
    return [re.sub(r"<[^>]+>", "", text).strip() for text in found]


def test_the_banner_says_a_team_pages_nobody_until_the_paging_is_fixed(client, crew, receiver):
    job, people = crew
    client.force_login(people["olga"])
    page = client.get("/").content
    (text,) = banner(page)
    assert "Alerts of team vision page nobody" in text and "No chat webhook" in text
    assert f'href="/teams/{job.team_id}/paging/"'.encode() in page

    client.force_login(people["ana"])
    answer = client.post(
        f"/teams/{job.team_id}/paging/",
        {
            "form": "policy",
            "rule-health-phone": "L1",
            "rule-health-sms": "L1",
            "rule-stability-chat": "L1",
            "rule-stability-phone": "L3",
            "digest": "on",
            "chat_webhook_url": receiver.url + "/hook",
            "chat_format": "slack",
            "ack_timeout_seconds": "120",
        },
        follow=True,
    )
    assert b"Notification policy saved." in answer.content
    policy = NotificationPolicy.objects.get(team=job.team)
    assert policy.ack_timeout_seconds == 120 and policy.chat_webhook_url.endswith("/hook")
    assert banner(answer.content) == []  # the chat reaches the managers now
    assert b"An L3 alert now pages:" in answer.content


def test_a_policy_the_rules_refuse_is_refused_on_the_page_with_the_reason(client, crew):
    job, people = crew
    client.force_login(people["ana"])
    answer = client.post(
        f"/teams/{job.team_id}/paging/",
        {
            "form": "policy",
            "rule-stability-chat": "L1",
            "rule-health-phone": "L1",
            "rule-health-sms": "L1",
            "ack_timeout_seconds": "120",
        },
        follow=True,
    )
    assert b"L3 stability alerts must go to at least two channels" in answer.content
    assert NotificationPolicy.objects.get(team=job.team).ack_timeout_seconds == 300  # untouched
    client.force_login(people["max"])  # a manager reads the policy, an admin changes it
    page = client.get(f"/teams/{job.team_id}/paging/").content
    assert b'name="rule-stability-chat"' not in page and b"only an admin changes" in page
    refused = client.post(f"/teams/{job.team_id}/paging/", {"form": "policy"}, follow=True)
    assert b"Only an admin may manage the notification channels" in refused.content


def test_contacts_shifts_and_a_test_page_through_the_page(client, crew, receiver, settings):
    settings.NOTIFY_PROVIDER_BASE_URL = receiver.url + "/provider"
    job, people = crew
    olga = people["olga"]
    client.force_login(people["ana"])
    path = f"/teams/{job.team_id}/paging/"
    bad = client.post(path, {"form": "contact", "user_id": olga.pk, "phone": "555"}, follow=True)
    assert b"E.164" in bad.content and not Contact.objects.exists()
    client.post(path, {"form": "contact", "user_id": olga.pk, "phone": "+15551234567"})
    assert Contact.objects.get(user=olga).phone == "+15551234567"

    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
    shift = {
        "form": "shift",
        "user_id": olga.pk,
        "starts_at": start.strftime("%Y-%m-%dT%H:%M"),
        "ends_at": (start + timedelta(hours=9)).strftime("%Y-%m-%dT%H:%M"),
    }
    client.post(path, shift)
    saved = OnCallShift.objects.get(user=olga)
    assert saved.starts_at == start  # the page's times are UTC
    backwards = client.post(path, {**shift, "ends_at": shift["starts_at"]}, follow=True)
    assert b"A shift must end after it starts." in backwards.content
    page = client.get(path).content.decode()
    assert "on call" in page and start.strftime("%Y-%m-%d %H:%M:00 UTC") in page

    client.post(path, {"form": "test", "user_id": olga.pk, "channel": "sms"})
    delivery = Delivery.objects.get(purpose="test")
    assert (delivery.channel, delivery.address) == ("sms", "+15551234567")
    assert attempt_delivery(delivery.pk) is None  # what the worker's task does
    assert receiver.to("/Messages.json")[0].form["To"] == "+15551234567"
    listed = client.get(path + "?partial=tests").content.decode()
    assert f'data-delivery-id="{delivery.pk}"' in listed and "sent" in listed

    client.post(path, {"form": "delete_shift", "shift_id": saved.pk})
    assert not OnCallShift.objects.exists()
    client.force_login(olga)  # on-call may read the page, not change shifts
    refused = client.post(path, {**shift}, follow=True)
    assert b"Only a manager or above may manage the on-call shifts" in refused.content


def test_silences_page_creates_lists_and_ends_and_oncall_cannot(client, crew):
    job, people = crew
    client.force_login(people["olga"])
    assert b'id="silence-form"' not in client.get("/silences/").content
    body = {
        "form": "create",
        "team_id": job.team_id,
        "job_id": job.pk,
        "hours": "2",
        "reason": "storage maintenance",
    }
    refused = client.post("/silences/", body, follow=True)
    assert b"Only a manager or above may silence" in refused.content
    client.force_login(people["max"])
    assert (
        b"A silence needs a reason"
        in client.post("/silences/", {**body, "reason": ""}, follow=True).content
    )
    nul = client.post("/silences/", {**body, "reason": "a\x00b"}, follow=True)
    assert b"A NUL character is not allowed (reason)." in nul.content
    page = client.post("/silences/", body, follow=True).content.decode()
    silence = Silence.objects.get()
    assert silence.ends_at - silence.starts_at == timedelta(hours=2) and silence.job == job
    assert f'data-silence-id="{silence.pk}"' in page and "storage maintenance" in page
    client.post("/silences/", {"form": "end", "silence_id": silence.pk})
    assert Silence.objects.get().ends_at <= timezone.now()
    assert AuditEntry.objects.filter(action="manage_silences", outcome_code="ok").count() == 2


def test_incidents_list_audit_for_managers_and_the_nav(client, crew):
    job, people = crew
    alert = raise_alert(job.pk, "L3")
    other = create_job("secret", "hidden").job
    raise_alert(other.pk, "L4")
    client.force_login(people["vic"])
    page = client.get("/incidents/").content.decode()
    assert f'data-incident-id="{alert.incident_id}"' in page and "secret/" not in page
    assert 'href="/audit/"' not in page and 'href="/admin/"' not in page
    assert f'href="/teams/{job.team_id}/report/"' in page  # one team: its report
    assert client.get("/audit/").status_code == 403

    now = timezone.now()
    EscalationRequest.objects.create(
        job=job,
        alert=alert,
        incident_id=alert.incident_id,
        level="L3",
        command_kind="checkpoint_and_pause",
        reason="r",
        requested_by=people["olga"],
        requested_at=now,
        expires_at=now + timedelta(minutes=15),
    )
    client.force_login(people["max"])
    page = client.get("/alerts/").content.decode()
    assert re.search(r'id="pending-badge" class="count" title[^>]*>1</span>', page)
    assert 'href="/audit/"' in page
    badge = client.get("/approvals/?partial=badge").content.decode()
    assert badge.startswith('<span id="pending-badge"') and ">1</span>" in badge
    audit = client.get("/audit/").content.decode()
    assert "<table" in audit and "UTC" in audit
    assert client.get("/teams/").status_code == 200


POLICY_FORM = {
    "form": "policy",
    "rule-health-phone": "L1",
    "rule-health-sms": "L1",
    "rule-stability-chat": "L1",
    "rule-stability-phone": "L3",
    "chat_format": "slack",
    "chat_webhook_url": "https://chat.example/hook",
    "ack_timeout_seconds": "300",
}


def test_an_admin_sends_the_drills_to_receivers_on_the_page_and_nobody_is_refused(client, crew):
    job, people = crew
    client.force_login(people["ana"])
    path = f"/teams/{job.team_id}/paging/"
    page = client.get(path).content.decode()
    assert 'name="drill_delivery"' in page and page.count('name="drill_receivers"') == 4
    answer = client.post(path, {**POLICY_FORM, "drill_delivery": "receivers"}, follow=True)
    assert b"a drill must page somebody" in answer.content
    policy = NotificationPolicy.objects.get(team=job.team)
    assert policy.drill_delivery == "on_call" and not policy.drill_receivers.exists()

    answer = client.post(
        path,
        {
            **POLICY_FORM,
            "drill_delivery": "receivers",
            "drill_receivers": [people["vic"].pk, people["olga"].pk],
        },
        follow=True,
    )
    assert b"Notification policy saved." in answer.content
    policy.refresh_from_db()
    assert policy.drill_delivery == "receivers"
    assert set(policy.drill_receivers.all()) == {people["vic"], people["olga"]}
    html = answer.content.decode()
    assert f'value="{people["vic"].pk}" checked' in html
    assert f'value="{people["max"].pk}" checked' not in html
    assert '<option value="receivers" selected>' in html

    client.force_login(people["vic"])  # a viewer reads the setting, without the form
    html = client.get(path).content.decode()
    assert 'name="drill_delivery"' not in html
    assert "Fire drills page the team's drill receivers: olga, vic." in html


def test_every_time_field_is_typed_as_iso_utc_not_in_the_browsers_locale(client, crew):
    """A ``date`` or ``datetime-local`` input shows the browser's locale (12/05/2026, 02:00 PM)
    while every other time on the console is ISO UTC: the forms take ISO text, and the page's
    own suggestion is what a person would type."""
    job, people = crew
    client.force_login(people["ana"])
    paging = f"/teams/{job.team_id}/paging/"
    for path in (paging, "/silences/", f"/teams/{job.team_id}/report/"):
        html = client.get(path).content.decode()
        assert not re.search(r'type="(date|datetime-local|time)"', html), path
    form = re.search(r'name="starts_at" value="([^"]+)"', client.get(paging).content.decode())
    assert form and re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", form.group(1))
    start = datetime.fromisoformat(form.group(1)).replace(tzinfo=UTC)
    shift = {"form": "shift", "user_id": people["olga"].pk, "starts_at": form.group(1)}
    client.post(paging, {**shift, "ends_at": (start + timedelta(hours=2)).isoformat(" ")[:16]})
    assert OnCallShift.objects.get().ends_at == start + timedelta(hours=2)
    refused = client.post(paging, {**shift, "ends_at": "12/05/2026 02:00 PM"}, follow=True)
    assert b"ends_at: YYYY-MM-DD HH:MM (UTC)" in refused.content
