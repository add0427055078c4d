"""Rotations and overrides: the pure rule, table-driven (daylight-saving hand-offs included),
then paging and the dashboard's "now and next" following it with a travelled clock."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

import pytest
import time_machine

from incidents.models import Membership, OnCallRotation, OnCallShift
from incidents.notifications.recipients import people_to_page
from incidents.teams.oncall import create_rotation, on_call_summary, who_is_on_call
from incidents.teams.rotation import (
    Override,
    Rotation,
    handoff_at,
    next_on_call,
    on_call_at,
    rotation_person,
)

# Weekly in Paris, 09:00 on Mondays: Europe's clocks go forward on 29 March 2026 and back on
# 25 October 2026, so the UTC instant of the hand-off moves by an hour across each.
PARIS = Rotation((1, 2, 3), 7, time(9, 0), "Europe/Paris", date(2026, 3, 23))
# Daily in New York at 02:30, a wall-clock time 8 March 2026's spring-forward skips.
NEW_YORK = Rotation((1, 2), 1, time(2, 30), "America/New_York", date(2026, 3, 7))


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("rotation", "at", "person"),
    [
        (PARIS, utc(2026, 3, 23, 7, 59), None),  # before the first hand-off
        (PARIS, utc(2026, 3, 23, 8, 0), 1),  # 09:00 CET
        (PARIS, utc(2026, 3, 30, 6, 59), 1),
        (PARIS, utc(2026, 3, 30, 7, 0), 2),  # 09:00 CEST: the turn lasted 167 hours
        (PARIS, utc(2026, 4, 6, 7, 0), 3),
        (PARIS, utc(2026, 4, 13, 7, 0), 1),  # round again
        (PARIS, utc(2026, 10, 26, 7, 59), 1),  # turn 30 lasts 169 hours, to 09:00 CET
        (PARIS, utc(2026, 10, 26, 8, 0), 2),
        (
            PARIS,
            utc(2031, 1, 6, 8, 0),
            (1, 2, 3)[(date(2031, 1, 6) - date(2026, 3, 23)).days // 7 % 3],
        ),
        (NEW_YORK, utc(2026, 3, 7, 7, 30), 1),  # 02:30 EST
        (NEW_YORK, utc(2026, 3, 8, 7, 29), 1),
        (NEW_YORK, utc(2026, 3, 8, 7, 30), 2),  # the skipped 02:30 happens at 03:30 EDT
        (NEW_YORK, utc(2026, 3, 9, 6, 29), 2),
        (NEW_YORK, utc(2026, 3, 9, 6, 30), 1),  # 02:30 EDT
    ],
)
def test_whose_turn_it_is(rotation, at, person):
    assert rotation_person(rotation, at) == person


def test_hand_offs_follow_the_zones_clock():
    assert handoff_at(PARIS, 0) == utc(2026, 3, 23, 8)
    assert handoff_at(PARIS, 1) - handoff_at(PARIS, 0) == timedelta(hours=167)
    assert handoff_at(PARIS, 31) - handoff_at(PARIS, 30) == timedelta(hours=169)


TUESDAY_NIGHT = Override(9, utc(2026, 3, 31, 18), utc(2026, 4, 1, 6))
LATER_SWAP = Override(8, utc(2026, 3, 31, 20), utc(2026, 3, 31, 22))


@pytest.mark.parametrize(
    ("at", "people"),
    [
        (utc(2026, 3, 31, 17, 59), [2]),
        (utc(2026, 3, 31, 18), [9, 2]),  # the override first, the rotation's person behind
        (utc(2026, 3, 31, 21), [8, 9, 2]),  # overlapping overrides: the latest start first
        (utc(2026, 4, 1, 6), [2]),  # end exclusive
    ],
)
def test_overrides_come_first(at, people):
    assert on_call_at([PARIS], [TUESDAY_NIGHT, LATER_SWAP], at) == people


@pytest.mark.parametrize(
    ("now", "people", "at"),
    [
        (utc(2026, 3, 31, 12), [9, 2], utc(2026, 3, 31, 18)),
        (utc(2026, 4, 1, 6), [3], utc(2026, 4, 6, 7)),
        (utc(2026, 3, 1), [1], utc(2026, 3, 23, 8)),  # before the first turn: nobody, then 1
    ],
)
def test_who_is_next_and_from_when(now, people, at):
    handover = next_on_call([PARIS], [TUESDAY_NIGHT, LATER_SWAP], now)
    assert handover is not None and (handover.people, handover.at) == (people, at)


def test_nothing_next_without_rotations_or_coming_overrides():
    assert next_on_call([], [TUESDAY_NIGHT], utc(2026, 5, 1)) is None


@pytest.mark.django_db
def test_paging_and_the_summary_follow_the_rotation_and_its_overrides(scene):
    first, second = scene.extra("first", "oncall"), scene.extra("second", "oncall")
    viewer = scene.extra("watcher", "viewer")
    manager = scene.person("manager")
    created = create_rotation(
        manager,
        scene.team.pk,
        name="primary",
        people=[first.pk, second.pk],
        length_days=7,
        handoff_time=time(9),
        time_zone="Europe/Paris",
        starts_on=date(2026, 3, 23),
    )
    assert OnCallRotation.objects.get().pk == created.pk
    with time_machine.travel(utc(2026, 3, 25, 12), tick=False):
        assert who_is_on_call(scene.team) == [first]
        assert people_to_page(scene.team.pk, 0, utc(2026, 3, 25, 12), drill=False) == [first]
        summary = on_call_summary(scene.team)
        assert (summary.now, summary.next, summary.next_at) == (
            [first],
            [second],
            utc(2026, 3, 30, 7),
        )
    OnCallShift.objects.create(
        team=scene.team, user=second, starts_at=utc(2026, 3, 25, 18), ends_at=utc(2026, 3, 26, 6)
    )
    assert who_is_on_call(scene.team, utc(2026, 3, 25, 20)) == [second, first]
    assert people_to_page(scene.team.pk, 0, utc(2026, 3, 25, 20), drill=False) == [second]
    # A person who can no longer acknowledge is skipped: nobody is on call, managers are paged.
    Membership.objects.filter(user=first).update(role="viewer")
    assert who_is_on_call(scene.team, utc(2026, 3, 25, 12)) == []
    with pytest.raises(Exception) as refused:
        create_rotation(
            manager,
            scene.team.pk,
            name="bad",
            people=[viewer.pk],
            length_days=7,
            handoff_time=time(9),
            time_zone="Mars/Olympus",
            starts_on=date(2026, 3, 23),
        )
    assert refused.value.fields == {"time_zone": "an IANA time zone"}


@pytest.mark.django_db
def test_a_manager_arranges_a_rotation_on_the_paging_page_and_the_dashboard_says_who(scene, client):
    first, second = scene.extra("first", "oncall"), scene.extra("second", "oncall")
    client.force_login(scene.person("manager"))
    page = f"/teams/{scene.team.pk}/paging/"
    form = {
        "form": "rotation",
        "name": "primary",
        "people": f"{first.username}, {second.username}",
        "length_days": "7",
        "handoff_time": "09:00",
        "time_zone": "Europe/Paris",
        "starts_on": "2026-03-23",
    }
    for field, bad in [("time_zone", "Paris"), ("people", "nobody"), ("handoff_time", "9h")]:
        refused = client.post(page, {**form, field: bad}, follow=True)
        assert f"({field}: " in refused.content.decode()
    assert not OnCallRotation.objects.exists()
    with time_machine.travel(utc(2026, 3, 25, 12), tick=False):
        added = client.post(page, form, follow=True).content.decode()
        assert "Rotation added." in added and f"{first.username} → {second.username}" in added
        dashboard = client.get("/").content.decode()
    strip = dashboard[dashboard.index('id="on-call"') :]
    strip = strip[: strip.index("</section>")]
    assert f'on call now <span class="on-call-now"><b>{first.username}</b>' in strip
    assert f"<b>{second.username}</b></span> from 2026-03-30 07:00" in strip
    rotation_id = OnCallRotation.objects.get().pk
    client.post(page, {"form": "delete_rotation", "rotation_id": rotation_id})
    assert not OnCallRotation.objects.exists()


@pytest.mark.django_db
def test_rotations_through_the_api_and_who_is_on_call_next(scene):
    first, second = scene.extra("first", "oncall"), scene.extra("second", "oncall")
    manager, viewer = scene.api("manager"), scene.api("viewer")
    path = f"/api/v1/teams/{scene.team.pk}/rotations"
    body = {
        "name": "primary",
        "people": [first.pk, second.pk],
        "length_days": 7,
        "handoff_time": "09:00",
        "time_zone": "Europe/Paris",
        "starts_on": "2026-03-23",
    }
    assert viewer.post(path, body).status_code == 403
    for field, bad in [("time_zone", "Nowhere/Atall"), ("length_days", 0), ("people", [])]:
        refused = manager.post(path, {**body, field: bad})
        assert refused.status_code == 400 and field in refused.json()["fields"], refused.json()
    created = manager.post(path, body)
    assert created.status_code == 201, created.content
    assert manager.post(path, body).status_code == 409  # one name per team
    assert [r["name"] for r in viewer.get(path).json()] == ["primary"]
    now = viewer.get(f"/api/v1/teams/{scene.team.pk}/oncall", at="2026-03-25T12:00:00Z").json()
    assert [p["username"] for p in now["people"]] == [first.username]
    assert now["next"]["at"] == "2026-03-30T07:00:00+00:00"
    assert [p["username"] for p in now["next"]["people"]] == [second.username]
    assert manager.delete(f"{path}/{created.json()['id']}").status_code == 204
    assert viewer.get(path).json() == []
