"""Alert and incident services: dedup, escalation, resolution, timeline rows, transitions."""

from __future__ import annotations

import math
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction

from core.transitions import InvalidTransition, compare_and_swap
from incidents.alerts.lifecycle import (
    AlertSignal,
    alert_payload,
    raise_or_update_alert,
    resolve_alert,
)
from incidents.models import (
    ALERT_TRANSITIONS,
    Alert,
    AlertStatus,
    Incident,
    IncidentStatus,
    TimelineEntry,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)

NAN_SIGNAL = AlertSignal(
    rule_key="non-finite-loss-or-gradients",
    rule_name="NaN/Inf in loss or gradients",
    layer="stability",
    severity="L3",
    metric="loss",
    node="node-07",
    value=math.nan,
    threshold=None,
    description="loss is NaN at step 4512",
    step=4512,
    time=T0 + timedelta(seconds=30),
    first_step=4512,
    first_time=T0 + timedelta(seconds=30),
    action="checkpoint_and_pause",
    nodes=("node-07",),
    runbook_hint="nan-inf",
)
NOTICE = AlertSignal(
    rule_key="loss-deviation",
    rule_name="Loss deviates from its sliding window",
    layer="stability",
    severity="L1",
    metric="loss",
    node="",
    value=3.2,
    threshold=2.9,
    description="loss 3.2 is 2.5σ above its 200-step mean 2.7",
    step=4500,
    time=T0 + timedelta(seconds=20),
    first_step=4497,
    first_time=T0 + timedelta(seconds=17),
    duration_seconds=3.0,
    duration_steps=3,
    runbook_hint="loss-divergence",
)


def timeline(incident_id: int) -> list[tuple[str, int | None]]:
    return [(e.kind, e.step) for e in TimelineEntry.objects.filter(incident_id=incident_id)]


@pytest.mark.django_db
class TestRaising:
    def test_a_first_alert_opens_an_incident_with_its_first_rows_in_order(self, agent):
        outcome = raise_or_update_alert(agent.job_id, NAN_SIGNAL)
        alert = outcome.alert
        assert (outcome.created, outcome.incident_opened, outcome.action_due) == (True, True, True)
        incident = Incident.objects.get(pk=alert.incident_id)
        assert (incident.status, incident.level, incident.first_step) == ("open", "L3", 4512)
        assert incident.first_time == NAN_SIGNAL.first_time
        assert timeline(incident.pk) == [("first_anomalous_point", 4512), ("alert_raised", 4512)]
        first = TimelineEntry.objects.filter(incident=incident).first()
        assert first.at == NAN_SIGNAL.first_time and first.actor_kind == "system"

    def test_the_alert_carries_what_the_spec_lists(self, agent):
        alert = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert
        alert.refresh_from_db()
        assert math.isnan(alert.value)
        payload = alert_payload(alert)
        assert payload["metric"] == "loss" and payload["value"] == "NaN"
        assert payload["threshold"] is None and payload["severity"] == "L3"
        assert payload["job"]["id"] == agent.job_id and payload["job"]["name"].startswith("job-")
        assert payload["node"] == "node-07" and payload["duration_seconds"] == 0.0
        assert payload["action"] == "checkpoint_and_pause"
        assert payload["runbook"]["key"] == "non_finite"
        assert payload["runbook"]["suggestion"].startswith("Likely: numeric overflow")
        assert len(alert.runbook_suggestion) <= 160

    def test_the_same_fingerprint_updates_the_alert_without_new_rows(self, agent):
        first = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert
        again = raise_or_update_alert(
            agent.job_id, replace(NAN_SIGNAL, step=4600, time=NAN_SIGNAL.time + timedelta(60))
        )
        assert (again.created, again.escalated, again.action_due) == (False, False, False)
        assert again.alert.pk == first.pk and Alert.objects.count() == 1
        first.refresh_from_db()
        assert first.step == 4600 and first.duration_steps == 88
        assert len(timeline(first.incident_id)) == 2

    def test_another_node_is_another_alert_in_the_same_incident(self, agent):
        a = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert
        b = raise_or_update_alert(agent.job_id, replace(NAN_SIGNAL, node="node-08")).alert
        assert a.pk != b.pk and a.incident_id == b.incident_id
        assert [k for k, _ in timeline(a.incident_id)].count("alert_raised") == 2

    def test_a_more_severe_alert_raises_the_incident_level(self, agent):
        notice = raise_or_update_alert(agent.job_id, NOTICE).alert
        raise_or_update_alert(agent.job_id, NAN_SIGNAL)
        incident = Incident.objects.get(pk=notice.incident_id)
        assert incident.level == "L3"
        assert [k for k, _ in timeline(incident.pk)] == [
            "first_anomalous_point",
            "alert_raised",
            "alert_raised",
            "severity_changed",
        ]
        change = TimelineEntry.objects.get(incident=incident, kind="severity_changed")
        assert change.data["incident"] == {"from": "L1", "to": "L3"}

    def test_a_less_severe_alert_leaves_the_level_alone(self, agent):
        incident_id = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert.incident_id
        raise_or_update_alert(agent.job_id, NOTICE)
        assert Incident.objects.get(pk=incident_id).level == "L3"
        assert "severity_changed" not in [k for k, _ in timeline(incident_id)]

    def test_an_alert_whose_rule_became_more_severe_escalates(self, agent):
        alert = raise_or_update_alert(agent.job_id, NOTICE).alert
        outcome = raise_or_update_alert(
            agent.job_id, replace(NOTICE, severity="L2", action="lower_lr")
        )
        assert (outcome.created, outcome.escalated, outcome.previous_severity) == (
            False,
            True,
            "L1",
        )
        alert.refresh_from_db()
        assert (alert.severity, alert.action) == ("L2", "lower_lr")
        change = TimelineEntry.objects.get(incident_id=alert.incident_id, kind="severity_changed")
        assert change.data["alert"] == {"from": "L1", "to": "L2"}

    def test_performance_alerts_are_recorded_without_an_incident(self, agent):
        signal = replace(NOTICE, rule_key="throughput-drop", layer="performance", action="record")
        outcome = raise_or_update_alert(agent.job_id, signal)
        assert outcome.alert.incident_id is None and not Incident.objects.exists()
        assert resolve_alert(outcome.alert.pk, reason="back")
        assert not TimelineEntry.objects.exists()


@pytest.mark.django_db
class TestResolving:
    def test_resolving_the_last_alert_resolves_the_incident(self, agent):
        a = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert
        b = raise_or_update_alert(agent.job_id, NOTICE).alert
        assert resolve_alert(a.pk, reason="finite for 10 points", step=4700)
        assert Incident.objects.get(pk=a.incident_id).status == IncidentStatus.OPEN
        assert resolve_alert(b.pk, reason="back to normal", step=4710)
        incident = Incident.objects.get(pk=a.incident_id)
        assert incident.status == IncidentStatus.RESOLVED and incident.resolved_at is not None
        assert [k for k, _ in timeline(incident.pk)][-3:] == [
            "alert_resolved",
            "alert_resolved",
            "incident_resolved",
        ]

    def test_resolving_twice_writes_nothing_the_second_time(self, agent):
        alert = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert
        assert resolve_alert(alert.pk, reason="clear") is True
        rows = TimelineEntry.objects.count()
        assert resolve_alert(alert.pk, reason="clear") is False
        assert TimelineEntry.objects.count() == rows

    def test_a_condition_that_began_after_the_episode_ended_opens_a_new_incident(self, agent):
        first = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert
        resolve_alert(first.pk, reason="clear", step=4520)
        later = replace(NAN_SIGNAL, step=4600, first_step=4600)
        second = raise_or_update_alert(agent.job_id, later)
        assert second.created and second.incident_opened
        assert second.alert.pk != first.pk and second.alert.incident_id != first.incident_id

    def test_a_condition_that_began_within_the_episode_reopens_its_incident(self, agent):
        notice = raise_or_update_alert(agent.job_id, NOTICE).alert
        resolve_alert(notice.pk, reason="absorbed", step=4700)
        incident = Incident.objects.get()
        assert (incident.status, incident.resolved_step) == ("resolved", 4700)
        # "sustained for 10 minutes" fires at step 5100 about a run that began at step 4497
        sustained = replace(NOTICE, rule_key="loss-sustained", severity="L2", step=5100)
        outcome = raise_or_update_alert(agent.job_id, sustained)
        assert outcome.created and not outcome.incident_opened
        incident.refresh_from_db()
        assert (incident.status, incident.level, incident.resolved_at) == ("open", "L2", None)
        assert outcome.alert.incident_id == incident.pk
        assert [k for k, _ in timeline(incident.pk)][-4:] == [
            "incident_resolved",
            "incident_reopened",
            "alert_raised",
            "severity_changed",
        ]


@pytest.mark.django_db
def test_alert_transitions_follow_the_table(agent):
    alert = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert
    assert ALERT_TRANSITIONS[AlertStatus.RESOLVED] == set()
    assert compare_and_swap(
        Alert, alert.pk, table=ALERT_TRANSITIONS, expected=["firing"], new="acknowledged"
    )
    assert not compare_and_swap(  # lost the race: it is no longer firing
        Alert, alert.pk, table=ALERT_TRANSITIONS, expected=["firing"], new="acknowledged"
    )
    assert resolve_alert(alert.pk, reason="clear")  # acknowledged → resolved
    with pytest.raises(InvalidTransition):
        compare_and_swap(
            Alert, alert.pk, table=ALERT_TRANSITIONS, expected=["resolved"], new="firing"
        )


@pytest.mark.django_db
def test_the_database_refuses_a_second_active_alert_per_fingerprint(agent):
    alert = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert
    alert.pk = None
    with pytest.raises(IntegrityError), transaction.atomic():
        alert.save()


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_make_one_incident_and_one_alert_per_fingerprint(agent):
    barrier = threading.Barrier(4)
    errors = []

    def raise_one(node: str) -> None:
        try:
            barrier.wait(timeout=10)
            raise_or_update_alert(agent.job_id, replace(NAN_SIGNAL, node=node))
        except Exception as error:  # reported below, with the thread's traceback lost
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=raise_one, args=(n,)) for n in ("a", "a", "b", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert Incident.objects.count() == 1
    assert sorted(Alert.objects.values_list("node", flat=True)) == ["a", "b"]
    incident = Incident.objects.get()
    assert [k for k, _ in timeline(incident.pk)].count("first_anomalous_point") == 1


@pytest.mark.django_db
def test_the_admin_shows_alerts_incidents_and_timelines_read_only(admin_client, agent):
    alert = raise_or_update_alert(agent.job_id, NAN_SIGNAL).alert
    for path in ("alert", "incident", "timelineentry"):
        assert admin_client.get(f"/admin/incidents/{path}/").status_code == 200
        assert admin_client.get(f"/admin/incidents/{path}/add/").status_code == 403
    page = admin_client.get(f"/admin/incidents/incident/{alert.incident_id}/change/")
    assert page.status_code == 200 and b"First anomalous point" in page.content
    assert admin_client.post(f"/admin/incidents/alert/{alert.pk}/delete/").status_code == 403


def test_the_incident_is_titled_after_the_worst_level_it_reached(agent):
    raise_or_update_alert(agent.job_id, NOTICE, now=T0 + timedelta(seconds=20))
    incident = Incident.objects.get(job_id=agent.job_id)
    assert incident.title.startswith("Loss deviates")
    raise_or_update_alert(agent.job_id, NAN_SIGNAL, now=T0 + timedelta(seconds=30))
    incident.refresh_from_db()
    assert (incident.level, incident.title) == ("L3", "NaN/Inf in loss or gradients (loss)")


def test_an_updated_alert_describes_the_value_and_step_it_shows(agent):
    raise_or_update_alert(agent.job_id, NOTICE, now=T0 + timedelta(seconds=20))
    later = replace(NOTICE, value=3.4, step=4501, description="loss 3.4 is 2.9σ above")
    raise_or_update_alert(agent.job_id, later, now=T0 + timedelta(seconds=21))
    alert = Alert.objects.get(job_id=agent.job_id)
    assert (alert.value, alert.step, alert.description) == (3.4, 4501, "loss 3.4 is 2.9σ above")
