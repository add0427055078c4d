"""Derived strings fit their columns by construction (core.text.fit): names at the protocol's
limits (200 characters, any storable unicode) brake, page and never break a later task."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from breakers.agent.protocol import MAX_NAME_LENGTH
from breakers.control.commands import IDEMPOTENCY_KEY_LENGTH
from breakers.detection.evaluation import evaluate_job
from breakers.detection.rules import install_default_pack
from breakers.models import Command, CommandKind
from core.text import fit
from incidents.models import (
    Alert,
    Contact,
    Delivery,
    Incident,
    Job,
    Membership,
    NotificationPolicy,
    OnCallShift,
)
from incidents.notifications.delivery import attempt_delivery
from incidents.notifications.rounds import dispatch_alert, fire_due_rounds
from incidents.notifications.routing import FIRST_LINE_LENGTH

# What the protocol lets through in a name: any character but NUL and lone surrogates.
NAMES = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
    min_size=1,
    max_size=MAX_NAME_LENGTH,
).filter(lambda name: name.strip() != "")


def brake_key(alert_id: int, node: str) -> str:
    return f"alert:{alert_id}:L4:isolate_node:{node}"


@hypothesis_settings(max_examples=300, deadline=None)
@given(first=NAMES, second=NAMES, alert_id=st.integers(1, 2**63 - 1))
def test_fit_always_fits_and_keeps_distinct_inputs_distinct(first, second, alert_id):
    for limit in (IDEMPOTENCY_KEY_LENGTH, FIRST_LINE_LENGTH, 64, 13, 1):
        for text in (brake_key(alert_id, first), brake_key(alert_id, second), first):
            fitted = fit(text, limit)
            assert len(fitted) <= limit
            assert fit(fitted, limit) == fitted  # fitting twice changes nothing
            if len(text) <= limit:
                assert fitted == text
        if first != second and limit >= 13:
            assert fit(brake_key(alert_id, first), limit) != fit(brake_key(alert_id, second), limit)


def test_fit_keeps_a_readable_prefix():
    fitted = fit("alert:1:L4:isolate_node:" + "n" * 300, 200)
    assert len(fitted) == 200 and fitted.startswith("alert:1:L4:isolate_node:nnn")


@pytest.fixture
def on_call(agent, sms_provider, receiver, settings):
    job = Job.objects.get(pk=agent.job_id)
    alice = get_user_model().objects.create(username="alice", email="alice@example.org")
    Membership.objects.create(user=alice, team=job.team, role="oncall")
    Contact.objects.create(user=alice, phone="+15551110001")
    now = datetime.now(UTC)
    OnCallShift.objects.create(
        team=job.team,
        user=alice,
        starts_at=now - timedelta(hours=8),
        ends_at=now + timedelta(hours=8),
    )
    NotificationPolicy.objects.filter(team=job.team).update(
        chat_webhook_url=receiver.url + "/hooks/chat", ack_timeout_seconds=300
    )
    return alice


@pytest.mark.django_db
def test_a_200_character_node_with_an_xid_brakes_and_pages(agent, agent_post, on_call, receiver):
    install_default_pack()
    node = ("ñode-" + "界" * 200)[:MAX_NAME_LENGTH]
    metric = ("gpu." + "7" * 200)[: MAX_NAME_LENGTH - 4] + ".xid"
    assert len(node) == len(metric) == MAX_NAME_LENGTH
    response = agent_post(
        "/api/v1/agent/metrics",
        {"points": [{"name": metric, "step": 10, "value": 79, "node": node}]},
    )
    assert response.status_code == 202, response.content
    evaluate_job(agent.job_id)

    alert = Alert.objects.get(job_id=agent.job_id, rule_key="hardware-error")
    assert alert.severity == "L4" and alert.node == node
    commands = Command.objects.filter(job_id=agent.job_id).order_by("pk")
    assert [(c.kind, c.params.get("node")) for c in commands] == [
        (CommandKind.TERMINATE, None),
        (CommandKind.ISOLATE_NODE, node),
    ]
    assert all(len(c.idempotency_key) <= IDEMPOTENCY_KEY_LENGTH for c in commands)
    assert len(Incident.objects.get(job_id=agent.job_id).title) <= 300

    # Paged: the deliveries are stored (their first line fits) and sent.
    ids = dispatch_alert(alert.pk)
    assert ids
    for delivery_id in ids:
        while attempt_delivery(delivery_id) is not None:
            pass
    deliveries = Delivery.objects.filter(alert=alert)
    assert deliveries and all(len(d.first_line) <= FIRST_LINE_LENGTH for d in deliveries)
    assert deliveries.first().first_line.startswith("L4 ")
    assert receiver.requests
    # The periodic rounds go on too (they failed every 15 s for every team before).
    fire_due_rounds(now=datetime.now(UTC) + timedelta(minutes=10))
