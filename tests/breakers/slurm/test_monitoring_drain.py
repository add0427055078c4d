"""Alertmanager's XID 79 for the node of a job on the real single-node Slurm: the job is
cancelled and the node drained by the same Slurm actions as a breaker's L4 (issue 21)."""

from __future__ import annotations

import pytest

from breakers.models import IntegrationToken, NodeDrain
from incidents.models import Alert, Job, JobStatus, Node
from tests.breakers.monitoring.stack import ALERTMANAGER, PROMETHEUS, brake_time, monitoring_stack
from tests.breakers.slurm.conftest import requires_slurm
from tests.breakers.slurm.test_jobs_on_slurm import bound_to_slurm, command_lines, submit
from tests.support.waiting import wait_for

pytestmark = [
    requires_slurm,
    pytest.mark.skipif(not (PROMETHEUS and ALERTMANAGER), reason="no Prometheus/Alertmanager"),
    pytest.mark.django_db(transaction=True),
]


def test_an_xid_79_from_prometheus_cancels_the_slurm_job_and_drains_its_node(
    slurm_cluster, live_console, worker, agent, tmp_path
):
    job = Job.objects.select_related("team").get(pk=agent.job_id)
    slurm_id, _ = submit(slurm_cluster, live_console, agent)
    bound_to_slurm(agent, slurm_id)
    node = slurm_cluster.node
    wait_for(
        lambda: Node.objects.filter(job=job, hostname=node).exists(), "the job's node registered"
    )
    token = IntegrationToken.issue(job.team, "alertmanager")[1]
    with monitoring_stack(
        tmp_path, nodes=("gpu-a", node), console=live_console, token=token, metrics_token=None
    ) as stack:
        brake_time(stack, job, node)
        wait_for(
            lambda: (
                NodeDrain.objects.filter(node__job=job).exists()
                and Job.objects.get(pk=job.pk).status == JobStatus.TERMINATED
            ),
            "the scancel and the drain",
            context=stack.logs,
        )
    assert slurm_cluster.job_state(slurm_id) == "CANCELLED"
    state, reason = slurm_cluster.node_state()
    alert = Alert.objects.get(job=job, rule_key="alertmanager:DCGMXidError")
    assert "DRAIN" in state and reason.startswith(f"brakeline: GPU XID error (alert {alert.pk})")
    lines = command_lines(alert.incident)
    assert f"{slurm_cluster.bin_dir}/scancel {slurm_id}" in lines
    assert any("state=drain" in line and f"nodename={node}" in line for line in lines)
    assert Node.objects.get(job=job, hostname=node).status == "isolated"
