"""Nothing an agent sends aims the Slurm brakes elsewhere (security issue): the console asks
the real Slurm which Slurm job and which nodes are the job's before it binds, cancels or drains.

The repro of the issue: a heartbeat with ``"slurm_job_id": "424242"`` (not its own), then an L4
whose node is ``gpu[001-512]``, made the console ``scancel 424242`` and drain that host list.
"""

from __future__ import annotations

import pytest

from breakers.control.commands import issue_command
from breakers.models import Command, CommandKind, NodeDrain, SchedulerBinding
from incidents.models import Alert, Job, Node, TimelineEntry
from tests.breakers.slurm.conftest import SlurmCluster, requires_slurm
from tests.support.authz import Api, make_member, raise_alert
from tests.support.waiting import wait_for
from tests.support.worker import worker_idle

pytestmark = [requires_slurm, pytest.mark.django_db(transaction=True)]

HEARTBEAT = "/api/v1/agent/heartbeat"
METRICS = "/api/v1/agent/metrics"


def sleeper(cluster: SlurmCluster, *options: str) -> str:
    """A Slurm job that only sleeps, running: somebody's job (options such as --comment)."""
    submitted = cluster.run("sbatch", "--parsable", *options, "--wrap=exec sleep 300")
    slurm_id = submitted.stdout.strip().split(";")[0]
    wait_for(lambda: cluster.job_state(slurm_id) == "RUNNING", f"Slurm job {slurm_id} to run")
    return slurm_id


def beat(slurm_id: str, nodelist: str = "localhost", **extra) -> dict:
    return {
        "step": 3,
        "status": "running",
        "hostname": "localhost",
        "slurm_job_id": slurm_id,
        "slurm_nodelist": nodelist,
        **extra,
    }


def xid(node: str = "localhost", step: int = 4) -> dict:
    return {"points": [{"name": "gpu.0.xid", "step": step, "value": 79.0, "node": node}]}


def bound(job_id: int, slurm_id: str) -> SchedulerBinding:
    """The worker checked the new Slurm context with Slurm and bound the job."""
    return wait_for(
        lambda: SchedulerBinding.objects.filter(job_id=job_id, slurm_job_id=slurm_id).first(),
        f"the job bound to Slurm job {slurm_id}",
    )


def calls(job_id: int) -> list[str]:
    rows = TimelineEntry.objects.filter(incident__job_id=job_id, data__event="slurm_call")
    return [row.data["command_line"] for row in rows.order_by("at", "pk")]


def refusals(job_id: int) -> list[str]:
    rows = TimelineEntry.objects.filter(incident__job_id=job_id, data__event="slurm_refused")
    return [row.message for row in rows.order_by("at", "pk")]


def test_a_foreign_slurm_job_id_is_not_bound_and_nothing_is_cancelled(
    slurm_cluster, worker, agent, agent_post
):
    foreign = sleeper(slurm_cluster, "--job-name=team-b-training")
    assert agent_post(HEARTBEAT, beat(foreign)).status_code == 200
    wait_for(worker_idle, "the worker to check it with Slurm")
    assert not SchedulerBinding.objects.filter(job_id=agent.job_id).exists()

    assert agent_post(METRICS, xid()).status_code in (200, 202)
    alert = wait_for(
        lambda: Alert.objects.filter(job_id=agent.job_id, severity="L4").first(), "the L4 alert"
    )
    wait_for(lambda: Command.objects.filter(job_id=agent.job_id).count() >= 2, "the brakes")
    wait_for(worker_idle, "the worker to be done")
    assert slurm_cluster.job_state(foreign) == "RUNNING"  # nothing cancelled
    assert "DRAIN" not in slurm_cluster.node_state()[0]  # nothing drained
    assert not any("scancel" in line or "state=drain" in line for line in calls(agent.job_id))
    assert alert.incident_id is not None


def test_a_binding_to_a_foreign_job_is_checked_again_before_any_cancel_or_drain(
    slurm_cluster, worker, agent, agent_post
):
    """Even a binding that exists (pinned by hand, or made before the check) is checked with
    Slurm right before acting."""
    foreign = sleeper(slurm_cluster, "--job-name=team-b-training")
    SchedulerBinding.objects.create(
        job_id=agent.job_id, executor="slurm", executor_pinned=True, slurm_job_id=foreign
    )
    Node.objects.create(job_id=agent.job_id, hostname="localhost")
    assert agent_post(METRICS, xid()).status_code in (200, 202)
    wait_for(lambda: len(refusals(agent.job_id)) >= 2, "the cancel and the drain refused")
    wait_for(worker_idle, "the worker to be done")
    assert slurm_cluster.job_state(foreign) == "RUNNING"
    assert "DRAIN" not in slurm_cluster.node_state()[0]
    assert not any("scancel" in line or "state=drain" in line for line in calls(agent.job_id))
    assert all(
        f"was not submitted for Brakeline job {agent.job_id}" in message
        for message in refusals(agent.job_id)
    )
    terminate = Command.objects.get(job_id=agent.job_id, kind=CommandKind.TERMINATE)
    assert terminate.result.get("by") != "slurm"  # nobody pretends Slurm did it


def test_this_jobs_slurm_job_is_bound_once_slurm_confirms_it(
    slurm_cluster, worker, agent, agent_post
):
    mine = sleeper(slurm_cluster, f"--comment=brakeline:{agent.job_id}")
    # Its own Slurm job, but not where it runs: not bound either.
    assert agent_post(HEARTBEAT, beat(mine, nodelist="gpu[001-512]")).status_code == 200
    wait_for(worker_idle, "the worker to check it with Slurm")
    assert not SchedulerBinding.objects.filter(job_id=agent.job_id).exists()
    assert agent_post(HEARTBEAT, beat(mine)).status_code == 200
    binding = bound(agent.job_id, mine)
    assert (binding.executor, binding.slurm_job_id, binding.slurm_nodelist) == (
        "slurm",
        mine,
        "localhost",
    )


def test_host_lists_are_refused_as_node_names(slurm_cluster, worker, agent, agent_post):
    mine = sleeper(slurm_cluster, f"--comment=brakeline:{agent.job_id}")
    assert agent_post(HEARTBEAT, beat(mine)).status_code == 200
    bound(agent.job_id, mine)
    refused = agent_post(HEARTBEAT, beat(mine, hostname="gpu[001-512]"))
    assert refused.status_code == 400 and "hostname" in refused.json()["fields"]
    refused = agent_post(METRICS, xid(node="gpu[001-512]"))
    assert refused.status_code == 400 and "points[0].node" in refused.json()["fields"]
    refused = agent_post(METRICS, xid(node="gpu001,gpu002"))
    assert refused.status_code == 400 and "points[0].node" in refused.json()["fields"]

    job = Job.objects.select_related("team").get(pk=agent.job_id)
    manager = Api(make_member(job.team, "manager"))
    response = manager.post(
        f"/api/v1/jobs/{agent.job_id}/isolate-node", {"node": "gpu[001-512]", "reason": "x"}
    )
    assert response.status_code == 400 and "node" in response.json()["fields"]

    # A drain command naming a host list (stored before this check, say) is refused by Slurm's
    # side too: nothing reaches scontrol update.
    alert = raise_alert(agent.job_id, "L3")  # an incident, whose timeline records it
    issue_command(
        agent.job_id,
        "isolate_node",
        reason="old",
        params={"node": "gpu[001-512]"},
        alert_id=alert.pk,
    )
    wait_for(lambda: refusals(agent.job_id), "the drain of a host list refused")
    wait_for(worker_idle, "the worker to be done")
    assert "is not one node's name" in refusals(agent.job_id)[0]
    assert "DRAIN" not in slurm_cluster.node_state()[0]
    assert not NodeDrain.objects.exists()


def test_a_managers_isolate_node_of_another_teams_node_is_refused(
    slurm_cluster, worker, agent, agent_post
):
    mine = sleeper(slurm_cluster, f"--comment=brakeline:{agent.job_id}")
    assert agent_post(HEARTBEAT, beat(mine)).status_code == 200
    bound(agent.job_id, mine)
    # The agent even reported points on that node: a Node row is no proof on Slurm.
    assert agent_post(METRICS, xid(node="team-b-node-07")).status_code in (200, 202)
    assert Node.objects.filter(job_id=agent.job_id, hostname="team-b-node-07").exists()
    wait_for(worker_idle, "the worker to be done")
    job = Job.objects.select_related("team").get(pk=agent.job_id)
    manager = Api(make_member(job.team, "manager"))

    response = manager.post(
        f"/api/v1/jobs/{agent.job_id}/isolate-node",
        {"node": "team-b-node-07", "reason": "flaky NVLink"},
    )
    assert response.status_code == 400, response.content
    body = response.json()
    assert "node" in body["fields"] and f"Slurm job {mine} runs on localhost" in body["detail"]
    assert not Command.objects.filter(job_id=agent.job_id, params__node="team-b-node-07").filter(
        issued_by_kind="person"
    )
    # The automatic L4 of that point asked for a drain of team-b-node-07: refused by Slurm.
    assert any("team-b-node-07 is not a node of Slurm job" in m for m in refusals(agent.job_id))
    assert not any("nodename=team-b-node-07" in line for line in calls(agent.job_id))
