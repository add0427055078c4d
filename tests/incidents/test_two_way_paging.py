"""Two-way paging end to end: the stand-in provider (a real HTTP server on 127.0.0.1) receives
the page, then posts the person's answer — an SMS reply "1", a call's keypress — signed with the
shared secret to the live console (Daphne); the chat message's button opens a one-time link.
The alert is acknowledged as the person paged, audited with the channel, on the timeline; a
forged, replayed, stale or unknown answer is refused with a 4xx naming the field."""

from __future__ import annotations

import json
import re
import time

import pytest

from incidents.alerts.lifecycle import raise_or_update_alert
from incidents.models import (
    Alert,
    AuditEntry,
    Membership,
    NotificationPolicy,
    PageReply,
    TimelineEntry,
    default_rules,
)
from incidents.notifications.reply_codes import BadReply, parse_sms_reply
from incidents.notifications.rounds import dispatch_alert
from tests.incidents.test_notifications import T0, nan_signal, send_all, team  # noqa: F401

SMS_PATH = "/api/v1/notifications/replies/sms"


@pytest.fixture
def paged(team, receiver, live_console, settings):  # noqa: F811
    """An L3 stability alert paged to alice by SMS, phone and chat (links to the live console)."""
    settings.BRAKELINE_PUBLIC_URL = live_console
    _, job, alice, _ = team
    rules = [*default_rules(), {"layer": "stability", "min_level": "L1", "channels": ["sms"]}]
    NotificationPolicy.objects.filter(team=job.team).update(rules=rules)
    alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
    send_all(dispatch_alert(alert.pk))
    return alert, alice


def sms_code(receiver) -> str:
    body = receiver.to("/Messages.json")[0].form["Body"]
    found = re.search(r"Reply 1 ([A-Z0-9]{5}) to acknowledge\.$", body)
    assert found, body
    return found.group(1)


def assert_acknowledged_by(alert: Alert, person, via: str, note: str) -> None:
    alert.refresh_from_db()
    assert alert.status == "acknowledged"
    row = TimelineEntry.objects.get(alert=alert, kind="acknowledged")
    assert row.actor == person and row.message.endswith(f"acknowledged by {person}: {note}")
    audit = AuditEntry.objects.get(action="acknowledge_alert", target_id=alert.pk, allowed=True)
    assert (audit.user, audit.via, audit.role) == (person, via, "oncall")


@pytest.mark.django_db(transaction=True)
def test_an_sms_reply_1_acknowledges_the_alert_as_the_person_paged(paged, receiver, live_console):
    alert, alice = paged
    code = sms_code(receiver)
    url = live_console + SMS_PATH
    reply = {"From": "+15551110001", "To": "+15550000000", "Body": "1", "MessageSid": "SM9"}

    forged = receiver.answer(url, reply, secret="not-the-secret")
    assert forged[0] == 403 and "X-Brakeline-Signature" in forged[1]["fields"]
    stale = receiver.answer(url, reply, timestamp=str(int(time.time()) - 3600))
    assert stale[0] == 403 and "X-Brakeline-Timestamp" in stale[1]["fields"]
    unknown = receiver.answer(url, {**reply, "Body": "1 ZZZZZ"})
    assert unknown[0] == 404 and "From" in unknown[1]["fields"]
    garbled = receiver.answer(url, {**reply, "Body": "yes please"})
    assert garbled[0] == 400 and "Body" in garbled[1]["fields"]
    stranger = receiver.answer(url, {**reply, "From": "+15559999999"})
    assert stranger[0] == 404
    alert.refresh_from_db()
    assert alert.status == "firing" and not PageReply.objects.exists()

    timestamp = str(int(time.time()))
    status, body = receiver.answer(
        url, {**reply, "Body": f" 1 {code.lower()} "}, timestamp=timestamp
    )
    assert (status, body) == (200, {"alert": alert.pk, "status": "acknowledged"})
    assert_acknowledged_by(alert, alice, "sms-reply", "by SMS reply")
    replayed = receiver.answer(url, {**reply, "Body": f" 1 {code.lower()} "}, timestamp=timestamp)
    assert replayed[0] == 409 and "proof" in replayed[1]["fields"]
    assert PageReply.objects.count() == 1
    assert TimelineEntry.objects.filter(alert=alert, kind="acknowledged").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_keypress_during_the_call_acknowledges(paged, receiver):
    alert, alice = paged
    twiml = receiver.to("/Calls.json")[0].form["Twiml"]
    action = re.search(r'action="([^"]+)"', twiml).group(1).replace("&amp;", "&")
    assert "Press 1 to acknowledge." in twiml
    call = {"To": "+15551110001", "From": "+15550000000", "CallSid": "CA1"}
    assert receiver.answer(action, {**call, "Digits": "2"})[0] == 400
    wrong_code = action.rsplit("=", 1)[0] + "=AAAAA"
    assert receiver.answer(wrong_code, {**call, "Digits": "1"})[0] == 404
    # The code is signed with the body: moving a signed keypress to another page fails.
    status, _ = receiver.answer(action, {**call, "Digits": "1"})
    assert status == 200
    assert_acknowledged_by(alert, alice, "phone-keypress", "by phone keypress")


@pytest.mark.django_db(transaction=True)
def test_the_chat_button_opens_a_one_time_link(paged, receiver, client):
    alert, alice = paged
    blocks = json.loads(receiver.to("/hooks/chat")[0].body)["blocks"]
    link = blocks[-1]["elements"][0]["url"]
    path = "/" + link.split("/", 3)[3]
    shown = client.get(path)  # a chat tool's preview: nothing is acknowledged
    assert shown.status_code == 200 and b"Acknowledge as alice" in shown.content
    alert.refresh_from_db()
    assert alert.status == "firing"
    assert client.post(path).status_code == 200
    assert_acknowledged_by(alert, alice, "chat-link", "from the chat message")
    again = client.post(path)
    assert again.status_code == 409 and b"already received" in again.content
    forged = client.get(path[:-6] + "xxxxx/")
    assert forged.status_code == 400 and b"not one the console signed" in forged.content


@pytest.mark.django_db(transaction=True)
def test_a_reply_from_someone_who_may_no_longer_acknowledge_is_refused_and_audited(
    paged, receiver, live_console
):
    alert, alice = paged
    Membership.objects.filter(user=alice).update(role="viewer")
    reply = {"From": "+15551110001", "Body": "1"}
    status, body = receiver.answer(live_console + SMS_PATH, reply)
    assert status == 403, body
    alert.refresh_from_db()
    assert alert.status == "firing"
    refusal = AuditEntry.objects.get(action="acknowledge_alert", target_id=alert.pk)
    assert (refusal.allowed, refusal.via, refusal.user) == (False, "sms-reply", alice)


@pytest.mark.parametrize(
    ("body", "code"),
    [("1", ""), (" ACK ", ""), ("1 k7q2p", "K7Q2P"), ("acknowledge K7Q2P", "K7Q2P")],
)
def test_sms_replies_that_acknowledge(body, code):
    assert parse_sms_reply(body) == code


@pytest.mark.parametrize("body", ["", "2", "yes", "1 K7Q2", "1 K7Q2P extra", "1 K0Q2P", "1 \x00"])
def test_sms_replies_that_do_not(body):
    with pytest.raises(BadReply) as refused:
        parse_sms_reply(body)
    assert refused.value.field == "Body"
