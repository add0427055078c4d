"""Issue 19: a team's fire drills page either the real people (the on-call person, then the
managers: ``on_call``, the default) or the team's drill receivers (``receivers``). Admins set it
in the notification policy; every refusal is a 400 naming the field, with nothing saved; the
round and the drill runner ask the same rule (``recipients.people_to_page``)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model

from incidents.alerts.lifecycle import raise_or_update_alert
from incidents.jobs import create_job
from incidents.models import (
    AuditEntry,
    Contact,
    Delivery,
    Job,
    Membership,
    NotificationPolicy,
    OnCallShift,
)
from incidents.notifications.policy import save_policy
from incidents.notifications.recipients import people_to_page
from incidents.notifications.rounds import dispatch_alert, fire_due_rounds
from tests.incidents.test_notifications import T0, nan_signal

pytestmark = pytest.mark.django_db


def put(api, path: str, body: dict):
    return api.client.put(
        path, json.dumps(body), content_type="application/json", headers=api.headers
    )


def policy_state(team) -> tuple:
    policy = NotificationPolicy.objects.get(team=team)
    receivers = sorted(policy.drill_receivers.values_list("id", flat=True))
    return policy.drill_delivery, receivers, policy.ack_timeout_seconds


# MEMBER, OTHER: members of the team; STRANGER: a member of another team only.
BAD_INPUTS = [
    ({"drill_delivery": "pager"}, "drill_delivery"),
    ({"drill_delivery": ""}, "drill_delivery"),
    ({"drill_delivery": 1}, "drill_delivery"),
    ({"drill_delivery": ["receivers"]}, "drill_delivery"),
    ({"drill_delivery": None}, "drill_delivery"),
    ({"drill_receivers": "MEMBER"}, "drill_receivers"),
    ({"drill_receivers": 5}, "drill_receivers"),
    ({"drill_receivers": None}, "drill_receivers"),
    ({"drill_receivers": {"id": "MEMBER"}}, "drill_receivers"),
    ({"drill_receivers": [True]}, "drill_receivers"),
    ({"drill_receivers": ["1"]}, "drill_receivers"),
    ({"drill_receivers": [1.0]}, "drill_receivers"),
    ({"drill_receivers": [["MEMBER"]]}, "drill_receivers"),
    ({"drill_receivers": [{"id": "MEMBER"}]}, "drill_receivers"),
    ({"drill_receivers": [0]}, "drill_receivers"),
    ({"drill_receivers": [-3]}, "drill_receivers"),
    ({"drill_receivers": [2**63]}, "drill_receivers"),
    ({"drill_receivers": [10**30]}, "drill_receivers"),
    ({"drill_receivers": [987654321]}, "drill_receivers"),  # nobody's id
    ({"drill_receivers": ["MEMBER", "STRANGER"]}, "drill_receivers"),
    ({"drill_receivers": ["MEMBER"] * 51}, "drill_receivers"),
    ({"drill_delivery": "receivers"}, "drill_receivers"),  # and nobody named: pages nobody
    ({"drill_delivery": "receivers", "drill_receivers": []}, "drill_receivers"),
    # All or nothing: a good field beside a bad one is not saved either.
    ({"ack_timeout_seconds": 60, "drill_receivers": ["STRANGER"]}, "drill_receivers"),
    ({"drill_receivers": ["MEMBER"], "drill_delivery": "pager"}, "drill_delivery"),
    (
        {"drill_receivers": ["MEMBER"], "drill_delivery": "receivers", "ack_timeout_seconds": 5},
        "ack_timeout_seconds",
    ),
]


def resolve(value, ids: dict[str, int]):
    if isinstance(value, str):
        return ids.get(value, value)
    if isinstance(value, list):
        return [resolve(v, ids) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, ids) for k, v in value.items()}
    return value


@pytest.mark.parametrize(("body", "field"), BAD_INPUTS)
def test_a_bad_drill_setting_is_a_400_naming_the_field_and_nothing_is_saved(scene, body, field):
    ids = {"MEMBER": scene.person("oncall").pk, "STRANGER": scene.person(None).pk}
    path = f"/api/v1/teams/{scene.team.pk}/notification-policy"
    before = policy_state(scene.team)
    response = put(scene.api("admin"), path, resolve(body, ids))
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"], response.json()
    assert policy_state(scene.team) == before == ("on_call", [], 300)
    refused = AuditEntry.objects.filter(action="manage_notifications").order_by("-id").first()
    assert refused is not None and refused.allowed and refused.outcome_code == "invalid"


@pytest.mark.parametrize(
    "body",
    [{"drill_receivers": []}, {"drill_delivery": "pager"}, {"drill_receivers": ["STRANGER"]}],
)
def test_a_refused_change_leaves_the_saved_receivers_as_they_were(scene, body):
    admin, member = scene.person("admin"), scene.person("oncall")
    save_policy(
        admin, scene.team.pk, {"drill_delivery": "receivers", "drill_receivers": [member.pk]}
    )
    path = f"/api/v1/teams/{scene.team.pk}/notification-policy"
    response = put(scene.api("admin"), path, resolve(body, {"STRANGER": scene.person(None).pk}))
    assert response.status_code == 400, response.content
    assert policy_state(scene.team) == ("receivers", [member.pk], 300)


def test_admins_set_the_receivers_members_read_them_with_their_names(scene):
    path = f"/api/v1/teams/{scene.team.pk}/notification-policy"
    manager, oncall = scene.person("manager"), scene.person("oncall")
    body = {"drill_delivery": "receivers", "drill_receivers": [oncall.pk, manager.pk, oncall.pk]}
    assert put(scene.api("manager"), path, body).status_code == 403
    assert policy_state(scene.team) == ("on_call", [], 300)
    response = put(scene.api("admin"), path, body)
    assert response.status_code == 200, response.content
    first, second = sorted([manager, oncall], key=lambda p: p.pk)
    expected = [
        {"id": first.pk, "username": first.username},
        {"id": second.pk, "username": second.username},
    ]
    assert response.json()["drill_delivery"] == "receivers"
    assert response.json()["drill_receivers"] == expected
    read = scene.api("viewer").get(path).json()
    assert read["drill_delivery"] == "receivers" and read["drill_receivers"] == expected
    # Other fields alone leave the setting as it is; back to on_call keeps the names.
    assert put(scene.api("admin"), path, {"ack_timeout_seconds": 60}).status_code == 200
    assert put(scene.api("admin"), path, {"drill_delivery": "on_call"}).status_code == 200
    assert policy_state(scene.team) == ("on_call", sorted([manager.pk, oncall.pk]), 60)


@pytest.fixture
def crew():
    """A team with a real job and a drill sandbox; alice on call, bob manager, ada admin,
    carol and dave (viewers) the would-be drill receivers, each with a phone."""
    real = create_job("research", "llama-7b").job
    drill = create_job("research", "drill-sandbox").job
    Job.objects.filter(pk=drill.pk).update(drill_sandbox=True)
    users = get_user_model().objects
    people = {}
    for name, role in (
        ("alice", "oncall"),
        ("bob", "manager"),
        ("ada", "admin"),
        ("carol", "viewer"),
        ("dave", "viewer"),
    ):
        people[name] = users.create(username=name, email=f"{name}@example.org")
        Membership.objects.create(user=people[name], team=real.team, role=role)
        Contact.objects.create(user=people[name], phone=f"+1555000{len(people):04d}")
    OnCallShift.objects.create(
        team=real.team,
        user=people["alice"],
        starts_at=T0 - timedelta(hours=8),
        ends_at=T0 + timedelta(hours=8),
    )
    NotificationPolicy.objects.filter(team=real.team).update(
        chat_webhook_url="https://chat.example/hook", ack_timeout_seconds=300
    )
    return real, Job.objects.get(pk=drill.pk), people


def paged(ids: list[int]) -> list[tuple[str, str, str]]:
    rows = Delivery.objects.filter(pk__in=ids)
    return sorted(rows.values_list("channel", "recipient__username", "purpose"))


def test_a_drill_sent_to_the_receivers_pages_them_in_every_round_real_alerts_the_on_call(crew):
    real, drill, people = crew
    save_policy(
        people["ada"],
        real.team_id,
        {
            "drill_delivery": "receivers",
            "drill_receivers": [people["dave"].pk, people["carol"].pk],
        },
    )
    with time_machine.travel(T0, tick=False):
        drill_alert = raise_or_update_alert(drill.pk, nan_signal(), now=T0).alert
        real_alert = raise_or_update_alert(real.pk, nan_signal(), now=T0).alert
        drill_ids = dispatch_alert(drill_alert.pk)
        real_ids = dispatch_alert(real_alert.pk)
    # In id order: carol (made first) has the round's one chat message.
    assert paged(drill_ids) == [
        ("chat", "carol", "drill"),
        ("phone", "carol", "drill"),
        ("phone", "dave", "drill"),
    ]
    assert all(
        d.first_line.startswith("DRILL — ") for d in Delivery.objects.filter(pk__in=drill_ids)
    )
    assert "Paging: carol, dave (round 0)" in Delivery.objects.get(pk=drill_ids[0]).body
    assert paged(real_ids) == [("chat", "alice", "alert"), ("phone", "alice", "alert")]

    # Unacknowledged: the real alert escalates to the manager, the drill to its receivers.
    with time_machine.travel(T0 + timedelta(minutes=5, seconds=1), tick=False):
        escalated = fire_due_rounds()
    by_alert = Delivery.objects.filter(pk__in=escalated)
    assert paged(list(by_alert.filter(alert=drill_alert).values_list("pk", flat=True))) == [
        ("chat", "carol", "drill"),
        ("phone", "carol", "drill"),
        ("phone", "dave", "drill"),
    ]
    assert paged(list(by_alert.filter(alert=real_alert).values_list("pk", flat=True))) == [
        ("chat", "bob", "escalation"),
        ("phone", "bob", "escalation"),
    ]


def test_with_on_call_a_drill_pages_the_on_call_person_as_before(crew):
    real, drill, people = crew
    save_policy(
        people["ada"],
        real.team_id,
        {
            "drill_delivery": "on_call",
            "drill_receivers": [people["carol"].pk],
        },
    )
    with time_machine.travel(T0, tick=False):
        alert = raise_or_update_alert(drill.pk, nan_signal(), now=T0).alert
        ids = dispatch_alert(alert.pk)
    assert paged(ids) == [("chat", "alice", "drill"), ("phone", "alice", "drill")]


def test_receivers_who_left_the_team_are_skipped_and_none_left_pages_as_any_alert(crew):
    real, _, people = crew
    save_policy(
        people["ada"],
        real.team_id,
        {
            "drill_delivery": "receivers",
            "drill_receivers": [people["carol"].pk, people["dave"].pk],
        },
    )
    policy = NotificationPolicy.objects.get(team=real.team)
    assert people_to_page(real.team_id, 0, T0, drill=False) == [people["alice"]]
    assert people_to_page(real.team_id, 1, T0, drill=False) == [people["bob"]]
    Membership.objects.filter(user=people["carol"]).delete()
    assert people_to_page(real.team_id, 3, T0, drill=True, policy=policy) == [people["dave"]]
    Membership.objects.filter(user=people["dave"]).delete()
    assert people_to_page(real.team_id, 0, T0, drill=True) == [people["alice"]]
    assert people_to_page(real.team_id, 1, T0, drill=True) == [people["bob"]]


def test_receivers_mode_is_refused_when_every_named_receiver_left_the_team(scene):
    admin, member = scene.person("admin"), scene.person("oncall")
    save_policy(admin, scene.team.pk, {"drill_receivers": [member.pk]})
    Membership.objects.filter(user=member).delete()
    path = f"/api/v1/teams/{scene.team.pk}/notification-policy"
    response = put(scene.api("admin"), path, {"drill_delivery": "receivers"})
    assert response.status_code == 400 and "drill_receivers" in response.json()["fields"]
    assert policy_state(scene.team) == ("on_call", [member.pk], 300)
