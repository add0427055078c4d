"""The whole chain with the real programs: a DCGM exporter on 127.0.0.1, Debian's Prometheus
scraping it with the shipped rules, Debian's Alertmanager routing to Brakeline's receiver on a
live Daphne, and Prometheus scraping Brakeline's /metrics. An XID 79 on node B stops the job
on node B and isolates node B, nothing else; the recovery resolves it all."""

from __future__ import annotations

import subprocess

import pytest

from bench._stack import daphne_command
from breakers.control.acknowledge import acknowledge_command
from breakers.models import Command, ExternalAlert, IntegrationToken, NodeBinding
from incidents.jobs import create_job
from incidents.models import Alert, Incident, Job, Node, Team
from tests.breakers.monitoring.stack import ALERTMANAGER, PROMETHEUS, brake_time, monitoring_stack
from tests.conftest import ROOT, free_port, server_environment, wait_for_port
from tests.support.waiting import wait_for

requires_prometheus = pytest.mark.skipif(
    not (PROMETHEUS and ALERTMANAGER),
    reason="apt-get install -y prometheus prometheus-alertmanager (see .ci/run)",
)
pytestmark = [requires_prometheus, pytest.mark.django_db(transaction=True)]
METRICS_TOKEN = "metrics-token-for-the-test"


@pytest.fixture
def console(django_db_blocker):
    """Daphne on the test database, with /metrics behind a token (its own process: the
    session's live console has no metrics token)."""
    port = free_port()
    with django_db_blocker.unblock():
        env = server_environment(BRAKELINE_METRICS_TOKEN=METRICS_TOKEN)
    argv = daphne_command(port)
    process = subprocess.Popen(argv, cwd=ROOT, env=env)
    try:
        wait_for_port(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_xid_79_on_node_b_brakes_the_job_on_node_b(console, celery_worker, tmp_path):
    jobs = {}
    for name, node in (("pretrain-a", "gpu-a"), ("pretrain-b", "gpu-b")):
        job = create_job("research", name).job
        Job.objects.filter(pk=job.pk).update(status="running", current_step=5000)
        Node.objects.create(job=job, hostname=node)
        NodeBinding.objects.create(job=job, hostname=node, source="operator")  # the inventory
        jobs[node] = job
    token = IntegrationToken.issue(Team.objects.get(name="research"), "alertmanager")[1]
    job_b, job_a = jobs["gpu-b"], jobs["gpu-a"]
    with monitoring_stack(
        tmp_path,
        nodes=("gpu-a", "gpu-b"),
        console=console,
        token=token,
        metrics_token=METRICS_TOKEN,
    ) as stack:
        wait_for(lambda: stack.query('up{job="brakeline"} == 1'), "Prometheus scraping /metrics")
        isolate, _, _ = brake_time(stack, job_b, "gpu-b")
        wait_for(
            lambda: ExternalAlert.objects.filter(job=job_b).count() == 8,
            "the eight GPU alerts of node B",
            context=stack.logs,
        )
        terminate = Command.objects.get(job=job_b, kind="terminate")
        assert (terminate.severity, isolate.severity) == ("L4", "L4")
        assert isolate.params == {"node": "gpu-b"}
        assert Command.objects.filter(job=job_b).count() == 2
        assert not Command.objects.filter(job=job_a).exists()
        assert not Alert.objects.filter(job=job_a).exists()
        (alert,) = Alert.objects.filter(job=job_b)
        assert alert.severity == "L4" and alert.node == "gpu-b"
        assert Incident.objects.filter(job=job_b).count() == 1
        fed = set(ExternalAlert.objects.filter(job=job_b).values_list("alert", flat=True))
        assert fed == {alert.pk}

        # Prometheus reads the brake back from Brakeline's /metrics.
        wait_for(
            lambda: stack.query('brakeline_commands_total{kind="isolate_node"} >= 1'),
            "Prometheus scraping Brakeline's command count",
            context=stack.logs,
        )
        assert stack.query('brakeline_alerts_firing{level="L4",layer="health"} == 1')

        # The job carries out its terminate (no training process here: its acknowledgement),
        # then the GPUs are reset (the gauge reads 0 again): everything resolves. Before the
        # terminate, the braked episode stays open (incidents.alerts.episode).
        acknowledge_command(job_b.pk, terminate.pk, status="succeeded", result={"step": 5000})
        stack.exporter.set_xid("gpu-b", 0)
        wait_for(
            lambda: Incident.objects.get(job=job_b).status == "resolved",
            "the incident of node B resolving",
            context=stack.logs,
        )
        alert.refresh_from_db()
        assert alert.status == "resolved"
        assert not ExternalAlert.objects.filter(status="firing").exists()
        assert Command.objects.filter(job=job_b).count() == 2  # nothing more
