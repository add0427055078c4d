"""The drill schedule's loose ends: a scheduled set that does not pass pages the person on call
and the admins (once, through the real Celery worker); a set is queued once per schedule key
however many beats race; a drill whose runner died does not stay "running" for ever."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

from breakers.drills import runs
from breakers.drills.paging import page_failed_set
from breakers.drills.scorecard import Line
from breakers.models import DrillRun, DrillStatus
from core.errors import Conflict
from incidents.models import Delivery, OnCallShift
from tests.conftest import _worker_is_idle

PASSING = [Line("breaker fired", True, "L3 by non-finite-loss-or-gradients", "L3")]
FAILING = [*PASSING, Line("checkpoint loads", False, "sha256 mismatch", "loads")]
KEY = "drill-schedule:1:v1:700"


def _on_call(scene, around: datetime):
    person = scene.person("oncall")
    OnCallShift.objects.create(
        team=scene.team,
        user=person,
        starts_at=around - timedelta(hours=8),
        ends_at=around + timedelta(hours=8),
    )
    return person


def _finish(run: DrillRun, lines: list[Line]) -> None:
    run.refresh_from_db()
    runs.start(run)
    runs.finish(run, lines)


def _wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    return predicate()


@pytest.mark.django_db(transaction=True)
def test_a_scheduled_set_that_does_not_pass_pages_on_call_and_admins_once(scene, celery_worker):
    on_call, admin = _on_call(scene, datetime.now(UTC)), scene.person("admin")
    nan, xid = runs.request_drills(scene.team, ["nan_loss", "xid"], schedule_key=KEY, launch=False)
    pages = Delivery.objects.filter(purpose="drill_failure")
    _finish(nan, FAILING)
    # The set is not complete: its first verdict's task (queued at commit) pages nobody.
    assert _wait_for(_worker_is_idle)
    assert not pages.exists() and not DrillRun.objects.filter(failure_paged_at__isnull=False)
    _finish(xid, PASSING)  # the last verdict completes the set: the worker pages
    assert _wait_for(lambda: pages.count() == 4), list(pages.values_list("channel", "status"))
    assert sorted(pages.values_list("recipient__username", "channel")) == sorted(
        (person.get_username(), channel)
        for person in (on_call, admin)
        for channel in ("chat", "email")
    )
    page = pages.first()
    assert "did not pass: 1 of 2 scenarios (nan_loss failed)" in page.first_line
    assert "checkpoint loads: sha256 mismatch" in page.body
    assert f"/drills/{nan.pk}/" in page.body and f"/teams/{scene.team.pk}/drills/" in page.body
    assert DrillRun.objects.filter(failure_paged_at__isnull=True).count() == 0
    assert page_failed_set(nan.drill_set) == []  # asked again (a retry): paged once
    assert pages.count() == 4


@pytest.mark.django_db
def test_a_set_a_person_asked_for_or_that_passed_pages_nobody(scene):
    _on_call(scene, datetime.now(UTC))
    (asked,) = runs.request_drills(scene.team, ["nan_loss"], launch=False)
    _finish(asked, FAILING)
    assert page_failed_set(asked.drill_set) == []  # somebody watches the set they started
    (passed,) = runs.request_drills(scene.team, ["xid"], schedule_key=KEY, launch=False)
    _finish(passed, PASSING)
    assert page_failed_set(passed.drill_set) == []
    assert not Delivery.objects.filter(purpose="drill_failure").exists()


@pytest.mark.django_db
def test_a_schedule_key_queues_its_set_once(scene):
    runs.request_drills(scene.team, ["nan_loss", "xid"], schedule_key=KEY, launch=False)
    with pytest.raises(Conflict, match="queued already"):
        runs.request_drills(scene.team, ["xid"], schedule_key=KEY, launch=False)
    assert DrillRun.objects.count() == 2  # nothing half-written by the refused second one
    runs.request_drills(scene.team, ["xid"], schedule_key=KEY.replace("700", "701"), launch=False)
    runs.request_drills(scene.team, ["xid"], launch=False)  # people may ask as often as they like
    runs.request_drills(scene.team, ["xid"], launch=False)
    assert DrillRun.objects.count() == 5


@pytest.mark.django_db
def test_a_drill_whose_runner_died_is_an_error_and_a_scheduled_one_pages(
    scene, settings, django_capture_on_commit_callbacks
):
    settings.DRILL_RUN_TIMEOUT_SECONDS = 3600.0
    start = datetime(2026, 11, 30, 3, 17, tzinfo=UTC)
    with time_machine.travel(start, tick=False):
        _on_call(scene, start)
        (lost,) = runs.request_drills(scene.team, ["hang"], schedule_key=KEY, launch=False)
        runs.start(lost)
        (never_started,) = runs.request_drills(scene.team, ["xid"], launch=False)
    with time_machine.travel(start + timedelta(minutes=59), tick=False):
        assert runs.expire_stale_runs() == []  # within the hour: still its runner's
    with time_machine.travel(start + timedelta(minutes=90), tick=False):
        (recent,) = runs.request_drills(scene.team, ["nan_loss"], launch=False)
    with time_machine.travel(start + timedelta(hours=2), tick=False):
        with django_capture_on_commit_callbacks() as asked:
            assert runs.expire_stale_runs() == [lost.pk, never_started.pk]
        assert len(asked) == 1  # the scheduled one asks the task to page
        lost.refresh_from_db()
        assert lost.status == DrillStatus.ERROR
        assert lost.error.startswith("the drill runner stopped: no verdict 7200 s after it started")
        assert DrillRun.objects.get(pk=never_started.pk).error.endswith(
            "was queued (BRAKELINE_DRILL_RUN_TIMEOUT_SECONDS=3600)"
        )
        assert DrillRun.objects.get(pk=recent.pk).status == DrillStatus.QUEUED
        assert len(page_failed_set(lost.drill_set)) == 2  # chat and e-mail to the on-call
        page = Delivery.objects.get(purpose="drill_failure", channel="email")
        assert "(hang error)" in page.first_line and "the drill runner stopped" in page.body
    connection.close()


@pytest.mark.django_db
def test_a_set_the_system_queues_is_audited_as_allowed(scene):
    from incidents.models import AuditEntry

    runs.request_drills(scene.team, ["xid"], schedule_key=KEY, launch=False)
    entry = AuditEntry.objects.get(action="run_drill")
    assert (entry.actor_kind, entry.allowed, entry.outcome_code) == ("system", True, "ok")
