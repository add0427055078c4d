"""Snoozing one alert: its escalation rounds page nobody until the snooze ends (recorded once
per round), then page again; the brake of the alert is untouched. Fixed instants
(time_machine), the paging team of test_silences."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine

from breakers.control.braking import brake_for_alert
from core.errors import Conflict, Forbidden, InvalidInput
from incidents.alerts.acknowledge import acknowledge_alert
from incidents.alerts.lifecycle import raise_or_update_alert
from incidents.alerts.snooze import snooze_alert
from incidents.models import AuditEntry, Delivery, Membership, TimelineEntry
from incidents.notifications.rounds import dispatch_alert, fire_due_rounds
from tests.incidents.test_silences import T0, paging, signal  # noqa: F401 (a fixture)
from tests.support.authz import make_member

pytestmark = pytest.mark.django_db


def test_a_snoozed_alert_pages_nobody_until_the_snooze_ends_then_pages_again(paging):  # noqa: F811
    job, _, alice, bob = paging
    with time_machine.travel(T0, tick=False):
        alert = raise_or_update_alert(job.pk, signal(), now=T0).alert
        assert dispatch_alert(alert.pk) != []  # the first page went out: alice looks
        snooze_alert(alice, alert.pk, minutes=60)
        # Never a brake: the automatic L3 pause is issued for a snoozed alert all the same.
        assert [c.kind for c in brake_for_alert(alert)] == ["checkpoint_and_pause"]
    paged = Delivery.objects.filter(alert=alert).count()
    with time_machine.travel(T0 + timedelta(minutes=10), tick=False):
        assert fire_due_rounds() == []  # the next round (due after 5 min) is held
        assert fire_due_rounds() == []
    assert Delivery.objects.filter(alert=alert).count() == paged
    held = TimelineEntry.objects.filter(alert=alert, data__notification="snoozed")
    assert held.count() == 1 and "(round 1)" in held.get().message
    assert AuditEntry.objects.filter(action="page_snoozed", target_id=alert.pk).count() == 1
    with time_machine.travel(T0 + timedelta(minutes=61), tick=False):
        assert fire_due_rounds() != []  # snooze over, still firing: the round pages now


def test_a_snooze_is_bounded_on_call_only_and_for_firing_alerts(paging):  # noqa: F811
    job, _, alice, bob = paging
    viewer = make_member(job.team, "viewer")
    with time_machine.travel(T0, tick=False):
        alert = raise_or_update_alert(job.pk, signal(), now=T0).alert
        for bad in (0, 241, 2.5, True):
            with pytest.raises(InvalidInput):
                snooze_alert(alice, alert.pk, minutes=bad)  # type: ignore[arg-type]
        with pytest.raises(Forbidden):
            snooze_alert(viewer, alert.pk, minutes=15)
        snoozed = snooze_alert(alice, alert.pk, minutes=240)
        assert snoozed.snoozed_until == T0 + timedelta(hours=4)
        again = snooze_alert(bob, alert.pk, minutes=15)  # replaces it, from now
        assert (again.snoozed_until, again.snoozed_by) == (T0 + timedelta(minutes=15), bob)
        acknowledge_alert(alice, alert.pk)
        with pytest.raises(Conflict):
            snooze_alert(alice, alert.pk, minutes=15)
    assert Membership.objects.filter(user=viewer).exists()
    refused = AuditEntry.objects.filter(action="snooze_alert", allowed=False)
    assert refused.filter(user=viewer).exists()


def test_a_snoozed_alert_that_rises_in_severity_pages_at_once(paging):  # noqa: F811
    job, _, alice, _ = paging
    with time_machine.travel(T0, tick=False):
        alert = raise_or_update_alert(job.pk, signal(severity="L2"), now=T0).alert
        dispatch_alert(alert.pk)
        snooze_alert(alice, alert.pk, minutes=240)
    with time_machine.travel(T0 + timedelta(minutes=2), tick=False):
        risen = raise_or_update_alert(job.pk, signal(severity="L3"), now=T0).alert
        assert (risen.pk, risen.severity, risen.snoozed_level) == (alert.pk, "L3", "L2")
        assert dispatch_alert(alert.pk) != []  # the L3 round pages despite the snooze
    assert not TimelineEntry.objects.filter(alert=alert, data__notification="snoozed").exists()
