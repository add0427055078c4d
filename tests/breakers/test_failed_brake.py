"""A brake whose checkpoint failed pages someone: an L3 of its own, through the real worker to
a real local chat receiver (it used to show only on the timeline)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from breakers.control.acknowledge import acknowledge_command
from breakers.control.commands import issue_command
from breakers.control.failed_brake import RULE_KEY
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.jobs import create_job
from incidents.models import (
    Alert,
    Contact,
    Delivery,
    Job,
    JobStatus,
    Membership,
    NotificationPolicy,
    OnCallShift,
)
from incidents.notifications.rounds import notify_alert
from tests.support.waiting import wait_for

ERROR = "checkpoint failed (OSError: [Errno 30] Read-only file system: '/ckpt')"


@pytest.fixture
def team_job(sms_provider, receiver):
    """A team whose L3 reaches its on-call person by chat and phone (real local servers)."""
    created = create_job("research", "llama-7b", "training")
    oncall = get_user_model().objects.create(username="alice")
    Membership.objects.create(user=oncall, team=created.job.team, role="oncall")
    Contact.objects.create(user=oncall, phone="+15551110001")
    now = timezone.now()
    OnCallShift.objects.create(
        team=created.job.team,
        user=oncall,
        starts_at=now - timedelta(hours=1),
        ends_at=now + timedelta(days=1),
    )
    NotificationPolicy.objects.filter(team=created.job.team).update(
        chat_webhook_url=receiver.url + "/hooks/chat"
    )
    return created.job


def _brake(job: Job, severity: str = "L3") -> int:
    issued = issue_command(job.pk, "checkpoint_and_pause", reason="loss is NaN", severity=severity)
    return issued.command.pk


def _nan_alert(job: Job) -> Alert:
    """The L3 the brake answered, paged first: the failed brake must page all the same."""
    now = timezone.now()
    signal = AlertSignal(
        rule_key="non-finite-loss-or-gradients",
        rule_name="Non-finite loss",
        layer="stability",
        severity="L3",
        metric="loss",
        node="",
        value=math.nan,
        threshold=None,
        description="loss is NaN",
        step=7,
        time=now,
        first_step=7,
        first_time=now,
    )
    with transaction.atomic():
        alert = raise_or_update_alert(job.pk, signal, now=now).alert
        notify_alert(alert.pk)
    return alert


@pytest.mark.django_db(transaction=True)
def test_a_failed_brake_checkpoint_raises_an_l3_that_pages(team_job, receiver, worker):
    nan = _nan_alert(team_job)
    wait_for(lambda: Delivery.objects.filter(alert=nan).exists(), "the NaN's page")
    command_id = _brake(team_job)
    acknowledge_command(
        team_job.pk, command_id, status="failed", result={"step": 7, "paused": True}, error=ERROR
    )
    alert = Alert.objects.get(job_id=team_job.pk, rule_key=RULE_KEY)
    assert (alert.severity, alert.status) == ("L3", "firing")
    assert alert.incident_id == nan.incident_id  # the same incident, the same level: not grouped
    assert "Read-only file system" in alert.description and "holds" in alert.description
    assert Job.objects.get(pk=team_job.pk).status == JobStatus.PAUSED
    wait_for(
        lambda: Delivery.objects.filter(alert=alert, status__in=["sent", "delivered"]).exists(),
        "the failed brake's page",
    )
    # The page's first line says what failed: "L3 research/llama-7b: checkpoint.failed = 1 …".
    assert any(b"checkpoint.failed" in r.body for r in receiver.requests)


@pytest.mark.django_db
@pytest.mark.parametrize(("brake", "level"), [("L3", "L3"), ("L4", "L4"), ("", "L3")])
def test_the_failed_brake_is_at_least_l3_and_as_severe_as_the_brake(team_job, brake, level):
    command_id = _brake(team_job, severity=brake)
    acknowledge_command(team_job.pk, command_id, status="failed", result={"step": 7}, error=ERROR)
    assert Alert.objects.get(job_id=team_job.pk, rule_key=RULE_KEY).severity == level


@pytest.mark.django_db
def test_a_brake_that_saved_raises_nothing(team_job):
    command_id = _brake(team_job)
    acknowledge_command(
        team_job.pk, command_id, status="succeeded", result={"step": 7, "path": "/ckpt/7.pt"}
    )
    assert not Alert.objects.filter(job_id=team_job.pk, rule_key=RULE_KEY).exists()
