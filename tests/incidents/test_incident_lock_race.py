"""A heartbeat resolving the watchdog's alert while that alert is being paged: the resolve
locks the incident and waits for the alert; the page holds the alert and, at COMMIT, checks its
deliveries' foreign key on the incident. With the incident locked FOR UPDATE that was a
deadlock (seen twice in full runs: the heartbeat answered 503); FOR NO KEY UPDATE lets the
check through. Waits on PostgreSQL's own view of who waits on a lock, never on a timer."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from incidents.alerts.lifecycle import raise_or_update_alert, resolve_alert
from incidents.jobs import create_job
from incidents.models import Alert, AlertStatus, Delivery
from tests.incidents.test_notifications import nan_signal
from tests.support.waiting import backend_pid, wait_for, waits_on_a_lock

pytestmark = pytest.mark.django_db(transaction=True)


def test_resolving_an_alert_while_it_is_paged_is_no_deadlock():
    job = create_job("research", "race-page", "training").job
    alert = raise_or_update_alert(job.pk, nan_signal()).alert
    assert alert.incident_id is not None
    resolver: dict = {}

    def resolve_it() -> None:  # the heartbeat's part: incident first, then the alert
        try:
            resolver["pid"] = backend_pid()
            resolver["won"] = resolve_alert(alert.pk, reason="heartbeats are back")
        except Exception as error:  # noqa: BLE001 - reported below
            resolver["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=resolve_it)
    with transaction.atomic():  # the page's part (fire_round): the alert's row, a delivery
        Alert.objects.select_for_update(of=("self",)).get(pk=alert.pk)
        Delivery.objects.create(
            team_id=job.team_id,
            alert=alert,
            incident_id=alert.incident_id,
            channel="chat",
            first_line="L3 page",
            body="…",
        )
        thread.start()
        wait_for(
            lambda: "pid" in resolver and waits_on_a_lock(resolver.get("pid")),
            "the resolve waits",
            60,
        )
    thread.join(timeout=60)
    assert "error" not in resolver, resolver.get("error")
    assert resolver["won"] is True
    assert Alert.objects.get(pk=alert.pk).status == AlertStatus.RESOLVED
    assert Delivery.objects.filter(alert=alert).count() == 1
