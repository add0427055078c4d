"""An Alertmanager HA pair delivers the same group at the same moment: one row per
fingerprint, one alert, each command once (each alert is applied under its fingerprint's lock:
the two deliveries interleave, and every alert is new in exactly one of them)."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, transaction

from breakers.control.acknowledge import acknowledge_command
from breakers.models import Command, ExternalAlert, NodeBinding
from breakers.monitoring.alertmanager import parse_webhook
from breakers.monitoring.receiver import receive_alertmanager
from incidents.jobs import create_job
from incidents.models import Alert, Incident, Job, Node
from tests.breakers.monitoring.test_alertmanager_receiver import alert, webhook
from tests.support.waiting import backend_pid, wait_for, waits_on_a_lock

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


def test_an_alert_of_the_job_while_slurm_acknowledges_its_l4_cancel_does_not_deadlock():
    """The Slurm executor acknowledges the L4 terminate (the job's row, then the incident's, to
    mark it mitigated) while Alertmanager delivers another GPU's alert of the same node: the
    webhook must wait for the job's row before it locks the incident, else each holds what the
    other waits for (PostgreSQL aborts one with "deadlock detected")."""
    job = create_job("research", "pretrain").job
    Job.objects.filter(pk=job.pk).update(status="running")
    Node.objects.create(job=job, hostname="gpu-b")
    NodeBinding.objects.create(job=job, hostname="gpu-b", source="operator")
    receive_alertmanager(
        job.team_id, parse_webhook(json.dumps(webhook([alert("gpu-b", 0)])).encode())
    )
    terminate = Command.objects.get(job=job, kind="terminate")
    another_gpu = parse_webhook(json.dumps(webhook([alert("gpu-b", 1)])).encode())
    job_held, webhook_waits, errors = threading.Event(), threading.Event(), []
    webhook_pid: list[int] = []

    def slurm_acknowledges() -> None:
        try:
            with transaction.atomic():
                # acknowledge_command's first lock, held until the webhook waits on a lock.
                Job.objects.select_for_update().get(pk=job.pk)
                job_held.set()
                webhook_waits.wait(60)
                acknowledge_command(
                    job.pk, terminate.pk, status="succeeded", result={"by": "slurm"}
                )
        except BaseException as error:
            errors.append(error)
        finally:
            job_held.set()
            connection.close()

    def alertmanager_delivers() -> None:
        try:
            job_held.wait(60)
            webhook_pid.append(backend_pid())
            receive_alertmanager(job.team_id, another_gpu)
        except BaseException as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=t) for t in (slurm_acknowledges, alertmanager_delivers)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: webhook_pid and waits_on_a_lock(webhook_pid[0]), "the webhook to wait")
    finally:
        webhook_waits.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors
    assert Command.objects.get(pk=terminate.pk).status == "succeeded"
    assert ExternalAlert.objects.filter(job=job).count() == 2
    assert Incident.objects.get(job=job).status == "mitigated"
