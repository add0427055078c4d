"""On-call shifts: who is on call when, arranged by managers, paged first by notifications."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from incidents.models import Membership, OnCallShift
from incidents.teams.oncall import who_is_on_call

pytestmark = pytest.mark.django_db


def shift_body(user, start, hours=8):
    return {
        "user_id": user.pk,
        "starts_at": start.isoformat(),
        "ends_at": (start + timedelta(hours=hours)).isoformat(),
    }


def test_a_manager_puts_people_on_call_and_who_is_on_call_follows_the_clock(scene):
    manager = scene.api("manager")
    day, night = scene.extra("day", "oncall"), scene.extra("night", "admin")
    start = timezone.now().replace(microsecond=0)
    path = f"/api/v1/teams/{scene.team.pk}/shifts"
    assert manager.post(path, shift_body(day, start)).status_code == 201
    created = manager.post(path, shift_body(night, start + timedelta(hours=8)))
    assert created.status_code == 201, created.content
    assert created.json()["username"] == night.username

    assert who_is_on_call(scene.team, start + timedelta(hours=1)) == [day]
    assert who_is_on_call(scene.team, start + timedelta(hours=8)) == [night]  # end exclusive
    assert who_is_on_call(scene.team, start + timedelta(hours=17)) == []
    assert who_is_on_call(scene.team.pk, start - timedelta(minutes=1)) == []

    viewer = scene.api("viewer")
    now = viewer.get(f"/api/v1/teams/{scene.team.pk}/oncall").json()
    assert [p["username"] for p in now["people"]] == [day.username]
    listed = viewer.get(path).json()
    assert [s["username"] for s in listed] == [day.username, night.username]
    later = viewer.get(path, ending_after=(start + timedelta(hours=9)).isoformat()).json()
    assert [s["username"] for s in later] == [night.username]


def test_overlapping_shifts_page_the_latest_taker_first(scene):
    start = timezone.now()
    early, late = scene.extra("early", "oncall"), scene.extra("late", "oncall")
    OnCallShift.objects.create(
        team=scene.team, user=early, starts_at=start, ends_at=start + timedelta(hours=8)
    )
    OnCallShift.objects.create(
        team=scene.team,
        user=late,
        starts_at=start + timedelta(hours=1),
        ends_at=start + timedelta(hours=9),
    )
    assert who_is_on_call(scene.team, start + timedelta(hours=2)) == [late, early]


def test_someone_demoted_to_viewer_is_no_longer_on_call(scene):
    start = timezone.now() - timedelta(hours=1)
    person = scene.extra("demoted", "oncall")
    OnCallShift.objects.create(
        team=scene.team, user=person, starts_at=start, ends_at=start + timedelta(hours=8)
    )
    assert who_is_on_call(scene.team) == [person]
    Membership.objects.filter(user=person).update(role="viewer")
    assert who_is_on_call(scene.team) == []


@pytest.mark.parametrize(
    ("who", "hours", "field"),
    [("viewer-person", 8, "user_id"), ("stranger", 8, "user_id"), ("oncall-person", -1, "ends_at")],
)
def test_shifts_are_checked(scene, who, hours, field):
    person = {
        "viewer-person": lambda: scene.extra("v", "viewer"),
        "stranger": lambda: scene.person(None),
        "oncall-person": lambda: scene.extra("o", "oncall"),
    }[who]()
    response = scene.api("manager").post(
        f"/api/v1/teams/{scene.team.pk}/shifts", shift_body(person, timezone.now(), hours)
    )
    assert response.status_code == 400 and field in response.json()["fields"]
    assert not OnCallShift.objects.exists()


def test_only_managers_arrange_shifts_and_removal_is_audited(scene):
    person = scene.extra("p", "oncall")
    path = f"/api/v1/teams/{scene.team.pk}/shifts"
    refused = scene.api("oncall").post(path, shift_body(person, timezone.now()))
    assert refused.status_code == 403 and "manager" in refused.json()["detail"]
    shift = scene.api("admin").post(path, shift_body(person, timezone.now())).json()
    assert scene.api("oncall").delete(f"{path}/{shift['id']}").status_code == 403
    assert scene.api("manager").delete(f"{path}/{shift['id']}").status_code == 204
    assert not OnCallShift.objects.exists()
    assert scene.api("manager").delete(f"{path}/{shift['id']}").status_code == 404
