"""Silences and grouping: pages held back, brakes never; an alert storm pages once.

The first tests run the services at fixed instants (time_machine); the last two run the real
path: agent HTTP → a real Celery worker's evaluation → the brake and the notification tasks →
real HTTP deliveries to a local receiver, counted.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model

from breakers.models import Command
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.jobs import create_job
from incidents.models import (
    Alert,
    AuditEntry,
    Contact,
    Delivery,
    Membership,
    NotificationPolicy,
    NotificationRound,
    OnCallShift,
    Silence,
    TimelineEntry,
)
from incidents.notifications.rounds import dispatch_alert, fire_due_rounds
from incidents.silences import create_silence, end_silence
from tests.support.authz import Api
from tests.support.waiting import wait_for
from tests.support.worker import worker_idle

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def signal(rule_key: str = "loss-nan", node: str = "", severity: str = "L3") -> AlertSignal:
    return AlertSignal(
        rule_key=rule_key,
        rule_name="Loss is NaN",
        layer="stability",
        severity=severity,
        metric="loss",
        node=node,
        value=math.nan,
        threshold=None,
        description="loss is NaN",
        step=4512,
        time=T0,
        first_step=4512,
        first_time=T0,
        action="checkpoint_and_pause",
    )


@pytest.fixture
def paging(sms_provider, receiver, settings):
    """A team whose L3 reaches its on-call (alice) by chat and phone, and a manager (bob)."""
    created = create_job("research", "llama-7b", "training")
    job = created.job
    users = get_user_model().objects
    alice, bob = users.create(username="alice"), users.create(username="bob")
    Membership.objects.create(user=alice, team=job.team, role="oncall")
    Membership.objects.create(user=bob, team=job.team, role="manager")
    Contact.objects.create(user=alice, phone="+15551110001")
    now = datetime.now(UTC)
    OnCallShift.objects.create(
        team=job.team,
        user=alice,
        starts_at=min(T0, now) - timedelta(hours=8),
        ends_at=max(T0, now) + timedelta(days=1),
    )
    NotificationPolicy.objects.filter(team=job.team).update(
        chat_webhook_url=receiver.url + "/hooks/chat"
    )
    return job, created.raw_token, alice, bob


@pytest.mark.django_db
def test_a_new_team_gets_the_default_policy():
    job = create_job("fresh-team", "first-job").job
    policy = NotificationPolicy.objects.get(team=job.team)
    assert policy.rules == NotificationPolicy().rules  # the default rules, saved


@pytest.mark.django_db
def test_a_silence_holds_pages_until_it_expires_and_then_they_go_out(paging):
    job, _, alice, bob = paging
    with time_machine.travel(T0, tick=False):
        silence = create_silence(
            bob, job.team_id, ends_at=T0 + timedelta(hours=1), reason="switch upgrade"
        )
    with time_machine.travel(T0 + timedelta(minutes=10), tick=False):
        alert = raise_or_update_alert(job.pk, signal(), now=T0).alert
        assert dispatch_alert(alert.pk) == []
        assert not Delivery.objects.filter(alert=alert).exists()
        note = TimelineEntry.objects.get(alert=alert, data__notification="silenced")
        assert note.kind == "note" and "switch upgrade" in note.message and "bob" in note.message
        audit = AuditEntry.objects.get(action="page_silenced", target_id=alert.pk)
        assert audit.user is None and audit.team_id == job.team_id and audit.allowed
        assert fire_due_rounds() == []  # still silenced a minute later: recorded once
    with time_machine.travel(T0 + timedelta(minutes=11), tick=False):
        assert fire_due_rounds() == []
        assert TimelineEntry.objects.filter(alert=alert, data__notification="silenced").count() == 1
    with time_machine.travel(T0 + timedelta(hours=2), tick=False):
        ids = fire_due_rounds()  # the silence is over, the alert still fires: it pages now
        assert sorted(Delivery.objects.filter(pk__in=ids).values_list("channel", flat=True)) == [
            "chat",
            "phone",
        ]
    assert Silence.objects.get(pk=silence.pk).ends_at == T0 + timedelta(hours=1)


@pytest.mark.django_db
def test_a_silence_of_one_rule_or_job_leaves_the_others_paged_and_can_end_early(paging):
    job, _, _, bob = paging
    other_job = create_job("research", "other-job", "training").job
    with time_machine.travel(T0, tick=False):
        create_silence(
            bob,
            job.team_id,
            ends_at=T0 + timedelta(hours=1),
            reason="r",
            rule_key="loss-nan",
            job_id=job.pk,
        )
        silenced = raise_or_update_alert(job.pk, signal(), now=T0).alert
        assert dispatch_alert(silenced.pk) == []
        other_rule = raise_or_update_alert(job.pk, signal("grad-nan", severity="L4"), now=T0)
        assert dispatch_alert(other_rule.alert.pk) != []
        other = raise_or_update_alert(other_job.pk, signal(), now=T0).alert
        assert dispatch_alert(other.pk) != []
    with time_machine.travel(T0 + timedelta(minutes=5), tick=False):
        silence = Silence.objects.get(job=job)
        assert end_silence(bob, silence.pk).ends_at == T0 + timedelta(minutes=5)
    with time_machine.travel(T0 + timedelta(minutes=6), tick=False):
        assert fire_due_rounds() != []  # held back at most RECHECK after the silence ended


@pytest.mark.django_db
def test_the_silence_api_is_for_managers_and_refuses_what_a_silence_cannot_be(paging):
    job, _, alice, bob = paging
    ends = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    body = {"team_id": job.team_id, "ends_at": ends, "reason": "maintenance"}
    refused = Api(alice).post("/api/v1/silences", body)
    assert refused.status_code == 403 and "manager" in refused.json()["detail"]
    assert AuditEntry.objects.filter(user=alice, action="manage_silences", allowed=False).exists()
    manager = Api(bob)
    bad = {
        "reason": ({**body, "reason": "  "}, "reason"),
        "past": ({**body, "ends_at": "2020-01-01T00:00:00Z"}, "ends_at"),
        "too long": (
            {**body, "ends_at": (datetime.now(UTC) + timedelta(days=30)).isoformat()},
            "ends_at",
        ),
        "other team's job": ({**body, "job_id": create_job("x", "y").job.pk}, "job_id"),
    }
    for what, (payload, name) in bad.items():
        answer = manager.post("/api/v1/silences", payload)
        assert answer.status_code == 400 and name in answer.json()["fields"], what
    assert not Silence.objects.exists()
    created = manager.post("/api/v1/silences", {**body, "job_id": job.pk})
    assert created.status_code == 201 and created.json()["active"] is True
    listed = Api(alice).get("/api/v1/silences").json()
    assert [s["id"] for s in listed] == [created.json()["id"]]
    assert Api(alice).post(f"/api/v1/silences/{listed[0]['id']}/end").status_code == 403
    ended = manager.post(f"/api/v1/silences/{listed[0]['id']}/end")
    assert ended.status_code == 200 and ended.json()["active"] is False


@pytest.mark.django_db
def test_two_alerts_of_one_incident_and_level_page_once(paging):
    job, _, _, _ = paging
    with time_machine.travel(T0, tick=False):
        first = raise_or_update_alert(job.pk, signal(node="node-01"), now=T0).alert
        second = raise_or_update_alert(job.pk, signal(node="node-02"), now=T0).alert
        assert first.incident_id == second.incident_id
        assert dispatch_alert(first.pk) != []
        assert dispatch_alert(second.pk) == []
        note = TimelineEntry.objects.get(alert=second, data__notification="grouped")
        assert f"grouped with alert #{first.pk}" in note.message
        higher = raise_or_update_alert(job.pk, signal(node="node-03", severity="L4"), now=T0)
        assert dispatch_alert(higher.alert.pk) != []  # a new level pages again
        Alert.objects.filter(pk=first.pk).update(status="resolved")
        third = raise_or_update_alert(job.pk, signal(node="node-04"), now=T0).alert
        assert dispatch_alert(third.pk) != []  # the leader resolved: the group pages again


def post_points(client, token: str, points: list[dict]) -> None:
    response = client.post(
        "/api/v1/agent/metrics",
        {"points": points},
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 202, response.content


def settle() -> bool:
    """The worker is idle and no delivery is still queued (retries come back later)."""
    return worker_idle() and not Delivery.objects.filter(status="queued").exists()


@pytest.mark.django_db(transaction=True)
def test_a_silenced_l3_is_braked_recorded_and_shown_but_pages_nobody(
    paging, receiver, worker, client
):
    job, token, _, bob = paging
    loud = create_job("research", "not-silenced", "training")
    create_silence(
        bob,
        job.team_id,
        job_id=job.pk,
        ends_at=datetime.now(UTC) + timedelta(hours=1),
        reason="planned restart of the storage",
    )
    for key in (token, loud.raw_token):
        healthy = [{"name": "loss", "step": s, "value": 2.0 + s % 3 * 0.01} for s in range(30)]
        post_points(client, key, [*healthy, {"name": "loss", "step": 30, "value": "NaN"}])
    for target in (job.pk, loud.job.pk):
        wait_for(
            lambda t=target: Command.objects.filter(job_id=t, kind="checkpoint_and_pause").exists(),
            f"the brake of job {target}",
        )
    wait_for(
        lambda: Delivery.objects.filter(alert__job_id=loud.job.pk, status="delivered").exists(),
        "the unsilenced job's page",
    )
    wait_for(settle, "the notification tasks to finish")

    alert = Alert.objects.get(job_id=job.pk, severity="L3")
    assert alert.status == "firing"  # raised and recorded
    assert not Delivery.objects.filter(alert__job_id=job.pk).exists()  # paged nobody
    assert TimelineEntry.objects.filter(alert=alert, data__notification="silenced").exists()
    assert AuditEntry.objects.filter(action="page_silenced", target_id=alert.pk).exists()
    brake = Command.objects.get(job_id=job.pk, kind="checkpoint_and_pause")
    assert brake.alert_id == alert.pk and brake.issued_by_kind == "system"  # braked all the same
    loud_chat = [r for r in receiver.to("/hooks/chat") if b"not-silenced" in r.body]
    assert len(loud_chat) == 1 and not [r for r in receiver.requests if b"llama-7b" in r.body]
    shown = client_as(client, bob).get("/alerts/")
    assert b"silenced" in shown.content and b"planned restart of the storage" in shown.content
    NotificationRound.objects.filter(status="scheduled").update(status="cancelled")


def client_as(client, user):
    client.force_login(user)
    return client


@pytest.mark.django_db(transaction=True)
def test_an_alert_storm_from_many_nodes_pages_once_per_level(paging, receiver, worker, client):
    job, token, _, _ = paging
    nodes = [f"node-{n:02d}" for n in range(8)]
    healthy = [
        {"name": "loss", "step": s, "value": 2.0, "node": node} for s in range(20) for node in nodes
    ]
    storm = [{"name": "loss", "step": 20, "value": "NaN", "node": node} for node in nodes]
    post_points(client, token, healthy + storm)
    wait_for(lambda: Alert.objects.filter(job_id=job.pk).count() == len(nodes), "8 L3 alerts")
    wait_for(
        lambda: (
            TimelineEntry.objects.filter(data__notification="grouped").count() == len(nodes) - 1
        ),
        "7 alerts grouped with the first",
    )
    wait_for(settle, "the notification tasks to finish")
    deliveries = Delivery.objects.filter(alert__job_id=job.pk)
    assert sorted(deliveries.values_list("channel", "status")) == [
        ("chat", "delivered"),
        ("phone", "sent"),
    ]
    assert len(receiver.to("/hooks/chat")) == 1 and len(receiver.to("/Calls.json")) == 1
    assert len({a.incident_id for a in Alert.objects.filter(job_id=job.pk)}) == 1
    NotificationRound.objects.filter(status="scheduled").update(status="cancelled")


@pytest.mark.django_db(transaction=True)
def test_two_workers_dispatching_one_storm_at_once_page_once(paging, worker):
    """The incident's row lock orders the two: the second finds the first one's round."""
    import threading

    from django.db import connection

    job = paging[0]
    alerts = [
        raise_or_update_alert(job.pk, signal(node=f"node-{n}"), now=T0).alert for n in range(2)
    ]
    barrier, results = threading.Barrier(2), {}

    def run(alert_id: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[alert_id] = dispatch_alert(alert_id)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(a.pk,)) for a in alerts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert NotificationRound.objects.filter(alert__in=alerts, number=0).count() == 1
    assert sorted(bool(ids) for ids in results.values()) == [False, True]
    wait_for(settle, "the deliveries to finish")
    NotificationRound.objects.filter(status="scheduled").update(status="cancelled")
