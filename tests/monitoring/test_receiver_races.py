"""An Alertmanager HA pair delivers the same group at the same moment: one row per
fingerprint, one alert, each command once (each alert is applied under its fingerprint's lock:
the two deliveries interleave, and every alert is new in exactly one of them)."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection

from breakers.models import Command, ExternalAlert, NodeBinding
from breakers.monitoring.alertmanager import parse_webhook
from breakers.monitoring.receiver import receive_alertmanager
from incidents.jobs import create_job
from incidents.models import Alert, Job, Node
from tests.monitoring.test_alertmanager_receiver import alert, webhook

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_deliveries_at_once_apply_once():
    job = create_job("research", "pretrain").job
    Job.objects.filter(pk=job.pk).update(status="running")
    Node.objects.create(job=job, hostname="gpu-b")
    NodeBinding.objects.create(job=job, hostname="gpu-b", source="operator")
    parsed = parse_webhook(json.dumps(webhook([alert("gpu-b", g) for g in range(8)])).encode())
    start, reports, errors = threading.Barrier(2), [], []

    def deliver() -> None:
        try:
            start.wait()
            reports.append(receive_alertmanager(job.team_id, parsed))
        except BaseException as error:  # re-raised below, in the test's thread
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliver) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sum(r.new for r in reports) == 8 and sum(r.repeated for r in reports) == 8
    assert ExternalAlert.objects.count() == 8
    assert Alert.objects.filter(job=job).count() == 1
    assert sorted(Command.objects.filter(job=job).values_list("kind", flat=True)) == [
        "isolate_node",
        "terminate",
    ]
