"""Notifications end to end against real local servers: a webhook / SMS-and-phone provider
receiver (http.server) and an SMTP server (aiosmtpd), both on 127.0.0.1. Escalation timing is
time travel (time_machine), never sleeps. Deliveries are run by calling the task bodies (the
services) in order; the fan-out through a real Celery worker is the last test.
"""

from __future__ import annotations

import email
import email.policy
import json
import math
import time
import urllib.parse
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from incidents.alerts.acknowledge import acknowledge_alert
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert, resolve_alert
from incidents.jobs import create_job
from incidents.models import (
    Alert,
    Contact,
    Delivery,
    Membership,
    NotificationPolicy,
    NotificationRound,
    OnCallShift,
    TimelineEntry,
)
from incidents.notifications.delivery import attempt_delivery
from incidents.notifications.rounds import dispatch_alert, fire_due_rounds, still_pages

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
FIRST_LINE = "L3 research/llama-7b: loss is NaN at step 4512 — paused"


def nan_signal(severity: str = "L3") -> AlertSignal:
    return AlertSignal(
        rule_key="loss-nan",
        rule_name="Loss is NaN",
        layer="stability",
        severity=severity,
        metric="loss",
        node="",
        value=math.nan,
        threshold=None,
        description="loss is NaN",
        step=4512,
        time=T0,
        first_step=4512,
        first_time=T0,
        action="checkpoint_and_pause",
        runbook_hint="nan",
    )


@pytest.fixture
def team(sms_provider, receiver, settings):
    settings.BRAKELINE_PUBLIC_URL = "https://brakeline.example"
    job = create_job("research", "llama-7b", "training").job
    users = get_user_model().objects
    alice = users.create(username="alice", email="alice@example.org")
    bob = users.create(username="bob", email="bob@example.org")
    Membership.objects.create(user=alice, team=job.team, role="oncall")
    Membership.objects.create(user=bob, team=job.team, role="manager")
    Contact.objects.create(user=alice, phone="+15551110001")
    Contact.objects.create(user=bob, phone="+15552220002")
    # Alerts carry T0, but what is not run under time_machine (a real worker, a task body)
    # resolves the on-call at the real clock: the shift covers both, on any date.
    now = datetime.now(UTC)
    OnCallShift.objects.create(
        team=job.team,
        user=alice,
        starts_at=min(T0, now) - timedelta(hours=8),
        ends_at=max(T0, now) + timedelta(hours=8),
    )
    NotificationPolicy.objects.filter(team=job.team).update(
        chat_webhook_url=receiver.url + "/hooks/chat", ack_timeout_seconds=300
    )
    return job.team, job, alice, bob


def send_all(ids: list[int]) -> None:
    for delivery_id in ids:
        while attempt_delivery(delivery_id) is not None:
            pass  # the task would come back after the backoff; here at once


def _the_chat_message_and_the_call_say_what_happened(receiver, job, alert) -> None:
    chat = receiver.to("/hooks/chat")[0]
    payload = json.loads(chat.body)
    assert payload["text"] == FIRST_LINE  # Slack-compatible: text + blocks
    details = payload["blocks"][1]["text"]["text"]
    for fact in ("Metric: loss", "Value: NaN", "Threshold: none", "Lasting: 0s", "Level: L3"):
        assert fact in details
    assert f"Job: #{job.pk} research/llama-7b" in details
    assert "Action: paused" in details and f"/jobs/{job.pk}/" in details
    assert "Next step: " + alert.runbook_suggestion in details
    call = receiver.to("/Calls.json")[0]
    assert call.form["To"] == "+15551110001" and FIRST_LINE in call.form["Twiml"]
    assert call.headers["Authorization"].startswith("Basic ")


@pytest.mark.django_db
def test_an_l3_reaches_the_on_call_on_two_channels_escalates_and_stops_on_ack(team, receiver):
    _, job, alice, bob = team
    with time_machine.travel(T0, tick=False):
        alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
        first = dispatch_alert(alert.pk)
        assert dispatch_alert(alert.pk) == []  # a redelivered task pages nobody twice
        send_all(first)
    round0 = Delivery.objects.filter(pk__in=first)
    assert sorted(round0.values_list("channel", "recipient__username")) == [
        ("chat", "alice"),
        ("phone", "alice"),
    ]
    _the_chat_message_and_the_call_say_what_happened(receiver, job, alert)
    assert dict(round0.values_list("channel", "status")) == {"chat": "delivered", "phone": "sent"}
    kinds = list(
        TimelineEntry.objects.filter(alert=alert, kind__startswith="notification").values_list(
            "kind", flat=True
        )
    )
    assert sorted(kinds) == ["notification_delivered", "notification_sent"]

    # Nobody acknowledges within the policy's 300 s: the manager is paged, and again.
    with time_machine.travel(T0 + timedelta(seconds=299), tick=False):
        assert fire_due_rounds() == []
    for minutes in (5, 10):
        with time_machine.travel(T0 + timedelta(minutes=minutes, seconds=1), tick=False):
            escalated = fire_due_rounds()
            send_all(escalated)
        assert sorted(
            Delivery.objects.filter(pk__in=escalated).values_list("channel", "recipient__username")
        ) == [("chat", "bob"), ("phone", "bob")]
    assert [r.form["To"] for r in receiver.to("/Calls.json")] == [
        "+15551110001",
        "+15552220002",
        "+15552220002",
    ]

    # Alice acknowledges: the round already scheduled never fires, nothing more goes out.
    with time_machine.travel(T0 + timedelta(minutes=12), tick=False):
        acknowledge_alert(alice, alert.pk)
    sent_before = len(receiver.requests)
    with time_machine.travel(T0 + timedelta(hours=2), tick=False):
        assert fire_due_rounds() == []
    assert len(receiver.requests) == sent_before
    assert set(NotificationRound.objects.filter(alert=alert).values_list("number", "status")) == {
        (0, "fired"),
        (1, "fired"),
        (2, "fired"),
        (3, "cancelled"),
    }


@pytest.mark.django_db
def test_the_provider_failing_twice_is_retried_with_backoff(team, receiver):
    _, job, _, _ = team
    receiver.plans["Calls.json"] = [500, 503]
    alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
    ids = dispatch_alert(alert.pk)
    phone = Delivery.objects.get(pk__in=ids, channel="phone")
    chat = Delivery.objects.get(pk__in=ids, channel="chat")
    assert attempt_delivery(chat.pk) is None  # the chat does not wait for the phone
    assert [attempt_delivery(phone.pk), attempt_delivery(phone.pk)] == [2.0, 4.0]
    phone.refresh_from_db()
    assert phone.status == "queued" and "HTTP 503" in phone.provider_response
    assert attempt_delivery(phone.pk) is None
    phone.refresh_from_db()
    assert (phone.status, phone.attempts, phone.provider_id) == ("sent", 3, "SM123")
    assert phone.latency_ms is not None and phone.latency_ms >= 0
    assert len(receiver.to("/Calls.json")) == 3
    assert attempt_delivery(phone.pk) is None and len(receiver.to("/Calls.json")) == 3


@pytest.mark.django_db
def test_a_permanent_failure_and_a_missing_number_are_failed_deliveries(team, receiver):
    _, job, alice, _ = team
    receiver.plans["Calls.json"] = [400]  # a 4xx will not get better by retrying
    alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
    send_all(dispatch_alert(alert.pk))
    phone = Delivery.objects.get(alert=alert, channel="phone")
    assert (phone.status, phone.attempts) == ("failed", 1) and "HTTP 400" in phone.provider_response
    assert len(receiver.to("/Calls.json")) == 1

    Contact.objects.filter(user=alice).delete()
    # Resolved: an open L3 of the same incident would group the next L3 with its page.
    Alert.objects.filter(pk=alert.pk).update(status="resolved")
    other = AlertSignal(**{**nan_signal().__dict__, "rule_key": "loss-inf"})
    alert = raise_or_update_alert(job.pk, other, now=T0).alert
    ids = dispatch_alert(alert.pk)
    phone = Delivery.objects.get(alert=alert, channel="phone")
    assert phone.pk not in ids and phone.status == "failed"
    assert "no phone address for alice" in phone.provider_response
    row = TimelineEntry.objects.get(alert=alert, data__delivery_id=phone.pk)
    assert row.kind == "notification_sent" and "failed" in row.message


@pytest.mark.django_db
def test_health_alerts_go_to_sms_and_phone_and_email_through_smtp(
    team,
    receiver,
    smtp_server,
    settings,
):
    team_, job, _, _ = team
    settings.EMAIL_HOST, settings.EMAIL_PORT = smtp_server.host, smtp_server.port
    policy = NotificationPolicy.objects.get(team=team_)
    policy.rules = [*policy.rules, {"layer": "health", "min_level": "L1", "channels": ["email"]}]
    policy.save()
    signal = nan_signal("L4")
    signal = AlertSignal(**{**signal.__dict__, "layer": "health", "metric": "node.failure"})
    signal = AlertSignal(**{**signal.__dict__, "value": 1.0, "node": "node-03"})
    alert = raise_or_update_alert(job.pk, signal, now=T0).alert
    send_all(dispatch_alert(alert.pk))
    assert sorted(Delivery.objects.filter(alert=alert).values_list("channel", "status")) == [
        ("email", "delivered"),
        ("phone", "sent"),
        ("sms", "sent"),
    ]
    sms = receiver.to("/Messages.json")[0].form
    assert sms["To"] == "+15551110001" and sms["Body"].startswith("L4 research/llama-7b:")
    assert "node-03" in sms["Body"].splitlines()[0] and f"/jobs/{job.pk}/" in sms["Body"]
    ((recipients, raw),) = smtp_server.messages
    assert recipients == ["alice@example.org"]
    mail = email.message_from_bytes(raw, policy=email.policy.default)
    assert (
        mail["Subject"].strip()
        == "L4 research/llama-7b: node.failure = 1 on node-03 at step 4512 — paused"
    )
    assert "Next step: " in mail.get_content() and "Node: node-03" in mail.get_content()


@pytest.fixture
def fan_out_by_hand():
    """This test plays the workers' part itself, to place the acknowledgement exactly; the
    deliveries' tasks go to a queue no worker reads, so the session's Celery worker (running
    once an earlier test started it) cannot race the test's own sends."""
    import redis
    from django.conf import settings as django_settings

    from config.celery import app

    parked = f"{django_settings.CELERY_TASK_DEFAULT_QUEUE}-parked"
    previous = app.conf.task_routes

    def route(routes) -> None:
        app.conf.task_routes = routes
        app.amqp.flush_routes()  # Celery caches its router: rebuild it on the new table
        app.amqp.__dict__.pop("router", None)

    route({**(previous or {}), "notifications.*": {"queue": parked}})
    yield
    route(previous)
    redis.Redis.from_url(django_settings.REDIS_URL).delete(parked)


@pytest.mark.django_db(transaction=True)
def test_an_acknowledgement_during_the_fan_out_stops_the_rest(team, receiver, fan_out_by_hand):  # noqa: E501
    """The race: alice acknowledges from the chat message while her phone is about to ring."""
    _, job, alice, _ = team
    alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert

    def acknowledge_from_chat(request) -> None:
        if request.path.endswith("/hooks/chat"):
            # Another thread, another database connection: as a person clicking would be.
            try:
                acknowledge_alert(alice, alert.pk)
            finally:
                connection.close()

    receiver.on_request = acknowledge_from_chat
    ids = dispatch_alert(alert.pk)
    chat = Delivery.objects.get(pk__in=ids, channel="chat")
    phone = Delivery.objects.get(pk__in=ids, channel="phone")
    assert attempt_delivery(chat.pk) is None
    assert Alert.objects.get(pk=alert.pk).status == "acknowledged"
    assert attempt_delivery(phone.pk) is None
    assert receiver.to("/Calls.json") == []
    phone.refresh_from_db()
    assert phone.status == "cancelled" and phone.attempts == 0
    assert list(NotificationRound.objects.filter(alert=alert, number=1).values_list("status")) == [
        ("cancelled",)
    ]
    with time_machine.travel(datetime.now(UTC) + timedelta(hours=1), tick=False):
        assert fire_due_rounds() == []
    assert len(receiver.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_raised_alerts_fan_out_through_a_real_worker(team, receiver, celery_worker, settings):  # noqa: E501
    """The trigger path: notify_alert after commit → dispatch task → one task per delivery.
    The phone provider fails twice (retried with backoff) while the chat is already delivered."""
    from incidents.notifications.rounds import notify_alert

    settings.NOTIFY_RETRY_BASE_SECONDS = 0.2
    receiver.plans["Calls.json"] = [500, 500]
    _, job, _, _ = team
    with transaction.atomic():
        alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
        notify_alert(alert.pk)
    _wait_for_page(alert, timeout=20)
    chat = Delivery.objects.get(alert=alert, channel="chat")
    phone = Delivery.objects.get(alert=alert, channel="phone")
    assert phone.attempts == 3 and chat.attempts == 1
    calls = [r.at for r in receiver.to("/Calls.json")]
    assert calls[1] - calls[0] >= 0.2 and calls[2] - calls[1] >= 0.4  # backoff 0.2 s, 0.4 s
    assert receiver.to("/hooks/chat")[0].at < calls[1]  # the chat never waited for the phone
    NotificationRound.objects.filter(alert=alert).update(status="cancelled")  # no lingering ETA


@pytest.mark.django_db(transaction=True)
def test_a_braking_alert_resolved_before_its_page_still_pages_saying_so(
    team, receiver, celery_worker
):
    """A stalled loop that answers the watchdog's brake at once: its next heartbeat resolves
    the alert before the dispatch task runs. The page still goes out (through a real worker,
    to the real receiver), says the alert has since resolved, and nothing escalates."""
    from incidents.notifications.rounds import notify_alert

    _, job, _, _ = team
    with transaction.atomic():
        alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
        notify_alert(alert.pk)  # dispatched after commit, by then resolved
        resolve_alert(alert.pk, reason="heartbeats are back")
    _wait_for_page(alert, timeout=30)
    for delivery in Delivery.objects.filter(alert=alert):
        assert delivery.first_line.endswith("(resolved since)"), delivery.first_line
        assert "before this page went out; paged because it braked the job" in delivery.body
    assert b"resolved since" in receiver.to("/hooks/chat")[0].body
    rounds = NotificationRound.objects.filter(alert=alert)
    assert list(rounds.values_list("number", "status")) == [(0, "fired")]  # no escalation


@pytest.mark.django_db(transaction=True)
def test_firing_a_round_locks_the_alert_only_not_its_job(team, receiver):
    """Ingest and acknowledgements lock the job's row, then the alert's: a round that locked
    the job's row with the alert's (FOR UPDATE over the join) deadlocked with them when nine
    drill sandboxes braked at once. The round must not wait on a job locked elsewhere."""
    import threading

    from incidents.models import Job
    from incidents.notifications.rounds import fire_round

    _, job, _, _ = team
    alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
    round_ = NotificationRound.objects.create(alert=alert, severity="L3", number=0, due_at=T0)
    locked, done = threading.Event(), threading.Event()

    def hold_the_job() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=job.pk)
                locked.set()
                done.wait(20)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_job)
    holder.start()
    try:
        assert locked.wait(20)
        with transaction.atomic():
            with connection.cursor() as cursor:  # waiting on the job's lock fails, not hangs
                cursor.execute("SET LOCAL lock_timeout = '3s'")
            ids = fire_round(round_.pk)
        assert ids and Delivery.objects.filter(alert=alert).count() == len(ids)
    finally:
        done.set()
        holder.join()
    NotificationRound.objects.filter(alert=alert).update(status="cancelled")  # no lingering ETA


@pytest.mark.parametrize(
    ("status", "severity", "action", "acknowledged", "number", "pages"),
    [
        ("firing", "L1", "none", False, 0, True),
        ("firing", "L3", "checkpoint_and_pause", False, 2, True),
        ("resolved", "L3", "checkpoint_and_pause", False, 0, True),  # braked, then resolved
        ("resolved", "L2", "lower_lr", False, 0, True),  # a brake below L3
        ("resolved", "L4", "none", False, 0, True),  # L3+ pages whatever its action
        ("resolved", "L1", "none", False, 0, False),  # a blip that went away
        ("resolved", "L2", "record", False, 0, False),
        ("resolved", "L3", "checkpoint_and_pause", False, 1, False),  # never escalated
        ("resolved", "L3", "checkpoint_and_pause", True, 0, False),  # a person saw it
        ("acknowledged", "L3", "checkpoint_and_pause", True, 0, False),
    ],
)
def test_which_alerts_still_page(status, severity, action, acknowledged, number, pages):
    alert = Alert(
        status=status,
        severity=severity,
        action=action,
        acknowledged_at=T0 if acknowledged else None,
    )
    assert still_pages(alert, number) is pages


@pytest.mark.django_db
def test_the_embedded_mode_sends_in_process(
    team,
    receiver,
    request,
    django_capture_on_commit_callbacks,
):
    """Eager tasks: the raise → dispatch → deliveries chain runs after commit, in process;
    a transient failure is retried at once, and the next round waits for the sweep."""
    from config.celery import app
    from incidents.notifications.rounds import notify_alert

    was_eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    request.addfinalizer(lambda: setattr(app.conf, "task_always_eager", was_eager))
    receiver.plans["Calls.json"] = [500, 500]
    _, job, _, _ = team
    with django_capture_on_commit_callbacks(execute=True):
        alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
        notify_alert(alert.pk)
    statuses = dict(Delivery.objects.filter(alert=alert).values_list("channel", "status"))
    assert statuses == {"chat": "delivered", "phone": "sent"}
    assert Delivery.objects.get(alert=alert, channel="phone").attempts == 3
    assert NotificationRound.objects.get(alert=alert, number=1).status == "scheduled"


@pytest.mark.django_db
def test_performance_findings_reach_nobody_now_and_the_daily_digest_once(
    team,
    receiver,
    smtp_server,
    settings,
):
    from incidents.notifications.policy import send_daily_digest

    settings.EMAIL_HOST, settings.EMAIL_PORT = smtp_server.host, smtp_server.port
    team_, job, _, _ = team
    slow = AlertSignal(
        **{
            **nan_signal("L2").__dict__,
            "rule_key": "throughput-low",
            "layer": "performance",
            "metric": "throughput",
            "value": 410.0,
            "threshold": 800.0,
        }
    )
    alert = raise_or_update_alert(job.pk, slow, now=T0).alert
    assert dispatch_alert(alert.pk) == [] and receiver.requests == []
    send_all(send_daily_digest(team_.pk, now=T0 + timedelta(hours=6)))
    assert send_daily_digest(team_.pk, now=T0 + timedelta(hours=7)) == []  # once a day
    assert sorted(rcpt for (rcpt,), _ in smtp_server.messages) == [
        "alice@example.org",
        "bob@example.org",
    ]
    mail = email.message_from_bytes(smtp_server.messages[0][1], policy=email.policy.default)
    assert mail["Subject"].strip() == "Daily digest research 2026-11-29: 1 performance finding(s)"
    assert "llama-7b: throughput = 410 (threshold 800)" in mail.get_content()
    assert receiver.requests == []  # never a phone, never a chat


@pytest.mark.django_db
def test_a_signed_provider_receipt_marks_the_call_delivered(team, receiver, client):
    from incidents.notifications.senders import provider_signature

    _, job, _, _ = team
    alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
    send_all(dispatch_alert(alert.pk))
    phone = Delivery.objects.get(alert=alert, channel="phone")
    assert phone.status == "sent" and phone.provider_id == "SM123"
    callback = receiver.to("/Calls.json")[0].form["StatusCallback"]
    assert callback == "https://brakeline.example/api/v1/notifications/receipts"
    form = {"CallSid": "SM123", "CallStatus": "completed"}
    path = "/api/v1/notifications/receipts"
    encoded, kind = urllib.parse.urlencode(form), "application/x-www-form-urlencoded"
    forged = client.post(path, encoded, content_type=kind, headers={"X-Twilio-Signature": "x"})
    assert forged.status_code == 403
    phone.refresh_from_db()
    assert phone.status == "sent"
    signature = provider_signature(callback, form, "secret")
    answer = client.post(
        path, encoded, content_type=kind, headers={"X-Twilio-Signature": signature}
    )
    assert answer.status_code == 204
    phone.refresh_from_db()
    assert phone.status == "delivered" and phone.delivered_at is not None
    rows = TimelineEntry.objects.filter(alert=alert, data__delivery_id=phone.pk)
    assert sorted(rows.values_list("kind", flat=True)) == [
        "notification_delivered",
        "notification_sent",
    ]


@pytest.mark.django_db
def test_a_failed_slurm_call_pages_on_call_and_managers_by_phone_and_chat(team, receiver):
    from breakers.executors.slurm.executor import notify_scheduler_failure

    _, job, _, _ = team
    alert = raise_or_update_alert(job.pk, nan_signal(), now=T0).alert
    failure = {"purpose": "cancel the job", "command_line": "scancel 42", "exit_status": 1}
    notify_scheduler_failure(alert.incident_id, {**failure, "stderr": "Invalid job id"})
    deliveries = Delivery.objects.filter(purpose="scheduler")
    assert sorted(deliveries.values_list("recipient__username", "channel")) == [
        ("alice", "chat"),
        ("alice", "phone"),
        ("bob", "chat"),
        ("bob", "phone"),
    ]
    send_all(list(deliveries.values_list("pk", flat=True)))
    call = receiver.to("/Calls.json")[0].form
    assert "Slurm could not cancel the job" in call["Twiml"]


def _wait_for_page(alert, timeout: float) -> None:
    """Until the chat delivery is delivered and the phone call sent (the real worker's)."""
    deadline = time.monotonic() + timeout
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        statuses = dict(Delivery.objects.filter(alert=alert).values_list("channel", "status"))
        if statuses == {"chat": "delivered", "phone": "sent"}:
            break
        time.sleep(0.05)
    assert statuses == {"chat": "delivered", "phone": "sent"}
