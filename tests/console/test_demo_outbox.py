"""The demo's pages reach someone: ``make demo`` sets up a policy, phones and a rotation, and
turns the Outbox on, so an alert is delivered to the console's Outbox page (nothing leaves the
machine), the person paged answers it there, and a fire drill's "paged" line passes."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from breakers.drills.paged_line import paging_facts
from breakers.drills.runner import wait_until
from breakers.drills.scorecard import Facts, paging_line
from console.management.commands.demo import DEMO_TEAM, set_up_demo_data
from incidents.alerts.lifecycle import raise_or_update_alert
from incidents.models import AuditEntry, Delivery, Job, Team
from incidents.notifications.reach import paging_reach
from incidents.notifications.rounds import dispatch_alert
from incidents.notifications.senders import OUTBOX_RESPONSE
from tests.incidents.test_notifications import nan_signal, send_all

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    settings.NOTIFY_OUTBOX = True
    settings.NOTIFY_PROVIDER_BASE_URL = ""  # no provider at all: the Outbox is the receiver
    name, _ = set_up_demo_data()
    return Job.objects.get(team__name=DEMO_TEAM, name=name)


def person(username: str):
    return get_user_model().objects.get(username=username)


def page(job: Job) -> int:
    alert = raise_or_update_alert(job.pk, nan_signal()).alert
    send_all(dispatch_alert(alert.pk))
    return alert.pk


def test_the_demo_team_pages_the_on_call_person_into_the_outbox(demo, client):
    team = Team.objects.get(name=DEMO_TEAM)
    reach = paging_reach(team)
    assert not reach.pages_nobody and reach.reached, reach.problems
    alert_id = page(demo)
    sent = Delivery.objects.filter(alert_id=alert_id)
    assert sorted(sent.values_list("channel", "recipient__username", "status")) == [
        ("chat", "oncall", "delivered"),
        ("phone", "oncall", "delivered"),
    ]
    assert set(sent.values_list("provider_response", flat=True)) == {OUTBOX_RESPONSE}

    client.force_login(person("manager"))
    seen = client.get("/outbox/").content.decode()
    assert "Press 1 to acknowledge." in seen and "[Acknowledge] → http" in seen
    assert 'class="outbox-answer"' not in seen  # only the person paged answers
    phone = sent.get(channel="phone")
    client.post("/outbox/", {"delivery_id": phone.pk})
    assert Delivery.objects.get(pk=phone.pk).alert.status == "firing"

    client.force_login(person("oncall"))
    assert ">Press 1</button>" in client.get("/outbox/").content.decode()
    answered = client.post("/outbox/", {"delivery_id": phone.pk}, follow=True).content.decode()
    assert "Acknowledged from the Outbox" in answered
    assert Delivery.objects.get(pk=phone.pk).alert.status == "acknowledged"
    audit = AuditEntry.objects.get(action="acknowledge_alert", allowed=True)
    assert (audit.user.username, audit.via) == ("oncall", "phone-keypress")


def test_a_drill_of_the_demo_team_passes_its_paged_line(demo):
    Job.objects.filter(pk=demo.pk).update(drill_sandbox=True)
    alert_id = page(demo)
    alert = Job.objects.get(pk=demo.pk).alerts.get(pk=alert_id)
    line = paging_line(Facts(paging=paging_facts(demo, alert, wait_until)))
    assert line.passed, (line.measured, line.expectation)
    assert line.measured == "chat, phone to oncall"


def test_without_the_outbox_there_is_no_outbox_page(demo, client, settings):
    settings.NOTIFY_OUTBOX = False
    client.force_login(person("oncall"))
    assert client.get("/outbox/").status_code == 404
