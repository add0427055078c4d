"""An agent that names another job's host captures none of that host's hardware alerts.

The attack: job RT1 heartbeated ``hostname: gpu-rt2``; a fatal XID 79 on gpu-rt2 then
terminated RT1 and isolated the node through it, and RT2, really on the failing GPU, got
nothing.
"""

from __future__ import annotations

import pytest

from breakers.models import Command, NodeBinding
from incidents.heartbeats import record_heartbeat
from incidents.jobs import create_job
from incidents.models import Alert, Job, Team
from tests.breakers.monitoring.test_alertmanager_receiver import alert, post, webhook

pytestmark = pytest.mark.django_db


@pytest.fixture
def rt(db):
    from breakers.models import IntegrationToken

    jobs = {}
    for name in ("rt1", "rt2"):
        job = create_job("realtime", name).job
        Job.objects.filter(pk=job.pk).update(status="running", current_step=100)
        jobs[name] = job
    token = IntegrationToken.issue(Team.objects.get(name="realtime"), "alertmanager")[1]
    return jobs, token


def _claims_host(job: Job, hostname: str) -> None:
    record_heartbeat(job.pk, step=101, status="running", hostname=hostname)


def test_a_hardware_alert_goes_to_the_job_bound_to_the_node_not_the_one_that_named_it(client, rt):
    jobs, token = rt
    NodeBinding.objects.create(job=jobs["rt2"], hostname="gpu-rt2", source="operator")
    _claims_host(jobs["rt2"], "gpu-rt2")
    _claims_host(jobs["rt1"], "gpu-rt2")  # heard from last, and lying
    assert post(client, token, webhook([alert("gpu-rt2", 0)])).status_code == 200
    assert not Alert.objects.filter(job=jobs["rt1"]).exists()
    assert not Command.objects.filter(job=jobs["rt1"]).exists()
    assert Alert.objects.filter(job=jobs["rt2"], severity="L4").exists()
    assert Command.objects.filter(job=jobs["rt2"], kind="terminate").exists()


def test_an_unverified_binding_pages_but_terminates_and_isolates_nothing(client, rt):
    jobs, token = rt
    _claims_host(jobs["rt1"], "gpu-rt2")  # only the agent says it runs there
    assert post(client, token, webhook([alert("gpu-rt2", 0)])).status_code == 200
    raised = Alert.objects.get(job=jobs["rt1"])
    assert raised.severity == "L4" and "unverified" in raised.description
    assert not Command.objects.filter(job=jobs["rt1"]).exists()  # no terminate, no isolate


def test_a_node_shows_how_it_is_bound_to_its_job(rt):
    from incidents.models import Node
    from tests.support.authz import Api, make_member

    jobs, _ = rt
    viewer = Api(make_member(Team.objects.get(name="realtime"), "viewer"))
    claimed = Node.objects.create(job=jobs["rt1"], hostname="gpu-rt2")
    inventory = Node.objects.create(job=jobs["rt2"], hostname="gpu-rt2")
    NodeBinding.objects.create(job=jobs["rt2"], hostname="gpu-rt2", source="operator")
    assert viewer.get(f"/api/v1/nodes/{claimed.pk}").json()["binding"] == "agent"
    assert viewer.get(f"/api/v1/nodes/{inventory.pk}").json()["binding"] == "operator"
