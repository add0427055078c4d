"""The heartbeat watchdog: silence past the deadline → one L3 alert, braked; heartbeats clear it."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from breakers.control.heartbeats import check_heartbeats
from breakers.models import Command
from incidents.heartbeats import record_heartbeat
from incidents.models import Alert, Job, JobStatus, TimelineEntry

pytestmark = pytest.mark.django_db


@pytest.fixture
def beating(agent):
    """A job heartbeating every 10 s at 1 s per step: deadline = max(10 s floor, 8 s)."""
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        for step in (0, 10, 20):
            record_heartbeat(agent.job_id, step=step, status="running", pid=4321)
            clock.shift(10)
        yield agent, clock


def test_silence_past_the_deadline_raises_one_l3_alert_and_brakes(beating):
    agent, clock = beating
    job = Job.objects.get(pk=agent.job_id)
    assert check_heartbeats() == []  # 10 s after the last beat: exactly at the deadline
    clock.shift(1)
    raised = check_heartbeats()
    assert len(raised) == 1 and check_heartbeats() == []  # edge-triggered: once per silence
    alert = Alert.objects.get(pk=raised[0])
    assert (alert.severity, alert.rule_key, alert.metric) == (
        "L3",
        "heartbeat-timeout",
        "heartbeat",
    )
    assert alert.value == pytest.approx(11.0) and alert.threshold == pytest.approx(10.0)
    assert alert.first_time == job.last_heartbeat_at and alert.first_step == 20
    assert "hung" in alert.runbook_key or alert.runbook_key == "hung_no_logs"
    command = Command.objects.get(job_id=agent.job_id)
    assert command.kind == "checkpoint_and_pause" and command.alert_id == alert.pk
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PAUSING
    kinds = list(
        TimelineEntry.objects.filter(incident=alert.incident).values_list("kind", flat=True)
    )
    assert kinds == ["first_anomalous_point", "alert_raised", "command_issued"]


def test_heartbeats_coming_back_resolve_it_and_a_new_silence_alerts_again(beating):
    agent, clock = beating
    clock.shift(15)
    first = check_heartbeats()
    clock.shift(1)
    record_heartbeat(agent.job_id, step=30, status="running")
    alert = Alert.objects.get(pk=first[0])
    assert alert.status == "resolved"
    assert Job.objects.get(pk=agent.job_id).heartbeat_overdue_since is None
    kinds = list(
        TimelineEntry.objects.filter(incident=alert.incident).values_list("kind", flat=True)
    )
    assert kinds[-1] in {"alert_resolved", "incident_resolved"}
    clock.shift(30)
    second = check_heartbeats()
    assert len(second) == 1 and second != first


@pytest.mark.parametrize("status", [JobStatus.FINISHED, JobStatus.TERMINATED])
def test_jobs_that_are_not_running_are_not_watched(beating, status):
    agent, clock = beating
    Job.objects.filter(pk=agent.job_id).update(status=status)
    clock.shift(3600)
    assert check_heartbeats() == []


def test_a_job_that_never_heartbeat_has_no_deadline(agent):
    assert Job.objects.get(pk=agent.job_id).heartbeat_deadline is None
    with time_machine.travel(timezone.now() + timedelta(days=1)):
        assert check_heartbeats() == []
