"""The console acting through a real Slurm on jobs submitted with sbatch (issue 10).

Each job is a real training script (``train_job.py``) that uses the SDK against the live console
(Daphne), so its heartbeats carry SLURM_JOB_ID; the real Celery worker evaluates its metrics and
runs the watchdog and the Slurm tasks. Every scheduler call must be on the incident timeline.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import pytest

from breakers.control.tasks import watchdog
from breakers.models import Command, CommandKind, CommandStatus, NodeDrain, SchedulerBinding
from incidents.models import Alert, Incident, Job, JobStatus, Node, TimelineEntry
from tests.breakers.slurm.conftest import SlurmCluster, requires_slurm
from tests.conftest import ROOT
from tests.support.authz import Api, make_member, raise_alert
from tests.support.waiting import wait_for

pytestmark = [requires_slurm, pytest.mark.django_db(transaction=True)]

SCRIPT = Path(__file__).resolve().parent / "train_job.py"


def submit(cluster: SlurmCluster, console: str, agent, **train: str) -> tuple[str, Path]:
    """sbatch the training script for ``agent``'s job: its Slurm job id and its folder."""
    folder = cluster.root / "jobs" / f"job-{agent.job_id}"
    folder.mkdir()
    env = cluster.env(  # sbatch exports its own environment to the job (--export=ALL)
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
        BRAKELINE_URL=console,
        BRAKELINE_TOKEN=agent.token,
        BRAKELINE_SPILL_DIR=str(folder / "spill"),
        BRAKELINE_CHECKPOINT_DIR=str(folder / "checkpoints"),
        BRAKELINE_SNAPSHOTS="0",
        TRAIN_DIR=str(folder),
        **{f"TRAIN_{key.upper()}": value for key, value in train.items()},
    )
    submitted = cluster.run(
        "sbatch",
        "--parsable",
        # How a job is submitted for Brakeline: the Slurm job carries the Brakeline job's id,
        # which the console checks with Slurm before it binds the job or acts on it.
        f"--comment=brakeline:{agent.job_id}",
        f"--chdir={folder}",
        f"--output={folder}/slurm-%j.out",
        # exec: the batch step's process is Python itself, so `scancel --batch` reaches it.
        f"--wrap=exec {sys.executable} {SCRIPT}",
        env=env,
    )
    return submitted.stdout.strip().split(";")[0], folder


def bound_to_slurm(agent, slurm_id: str) -> SchedulerBinding:
    return wait_for(
        lambda: SchedulerBinding.objects.filter(job_id=agent.job_id, slurm_job_id=slurm_id).first(),
        "a heartbeat carrying SLURM_JOB_ID",
        timeout=30,
    )


def slurm_calls(incident: Incident) -> list[dict]:
    rows = TimelineEntry.objects.filter(incident=incident, data__event="slurm_call")
    return [row.data for row in rows.order_by("at", "pk")]


def command_lines(incident: Incident) -> list[str]:
    return [call["command_line"] for call in slurm_calls(incident)]


def checkpoint_of(folder: Path) -> dict:
    path = folder / "checkpoint.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_a_hung_job_gets_usr1_checkpoints_then_is_cancelled(
    slurm_cluster, live_console, worker, agent, settings
):
    settings.COMMAND_ACK_TIMEOUT_SECONDS = {
        **settings.COMMAND_ACK_TIMEOUT_SECONDS,
        "checkpoint_and_pause": 1.0,
    }
    settings.EXECUTOR_GRACE_SECONDS = 2.0
    Job.objects.filter(pk=agent.job_id).update(heartbeat_timeout_seconds=1.0)
    slurm_id, folder = submit(slurm_cluster, live_console, agent, hang_at="20")
    binding = bound_to_slurm(agent, slurm_id)
    assert (binding.executor, binding.slurm_nodelist) == ("slurm", slurm_cluster.node)
    wait_for(lambda: (folder / "hung").exists(), "the job to hang", timeout=30)

    def stopped() -> bool:
        watchdog.delay()  # what beat sends every second
        time.sleep(0.3)
        return Job.objects.get(pk=agent.job_id).status == JobStatus.TERMINATED

    wait_for(stopped, "the watchdog to stop the hung job through Slurm", timeout=40)
    assert checkpoint_of(folder) == {
        "step": 20,
        "why": "USR1",
        "restart": 0,
        "slurm_job_id": slurm_id,
    }
    assert slurm_cluster.job_state(slurm_id) == "CANCELLED"
    pause = Command.objects.get(job_id=agent.job_id, kind=CommandKind.CHECKPOINT_AND_PAUSE)
    assert pause.status == CommandStatus.EXPIRED
    assert pause.result["executor"]["executor"] == "slurm" and pause.result["executor"]["stopped"]
    incident = Incident.objects.get(job_id=agent.job_id)
    lines = command_lines(incident)
    scancel = f"{slurm_cluster.bin_dir}/scancel"
    # USR1 first, then the grace (the job checkpointed but stayed hung), then scancel.
    assert lines.index(f"{scancel} --batch --signal=USR1 {slurm_id}") < lines.index(
        f"{scancel} {slurm_id}"
    )
    assert all(call["ok"] and call["exit_status"] == 0 for call in slurm_calls(incident))
    kinds = list(incident.timeline.values_list("kind", flat=True))
    assert kinds.index("terminated") > kinds.index("command_issued")
    assert incident.level == "L4"


def test_an_l4_hardware_error_cancels_and_drains_until_a_manager_returns_the_node(
    slurm_cluster, live_console, worker, agent
):
    job = Job.objects.select_related("team").get(pk=agent.job_id)
    manager, oncall = Api(make_member(job.team, "manager")), Api(make_member(job.team, "oncall"))
    slurm_id, folder = submit(slurm_cluster, live_console, agent, xid_at="15", hang_at="15")
    bound_to_slurm(agent, slurm_id)
    alert = wait_for(
        lambda: Alert.objects.filter(job_id=agent.job_id, severity="L4").first(), "the L4 alert"
    )
    assert (alert.rule_key, alert.node) == ("hardware-error", slurm_cluster.node)
    wait_for(
        lambda: (
            NodeDrain.objects.filter(node__job_id=agent.job_id).exists()
            and Job.objects.get(pk=agent.job_id).status == JobStatus.TERMINATED
        ),
        "the scancel and the drain",
        timeout=30,
    )
    assert slurm_cluster.job_state(slurm_id) == "CANCELLED"
    state, reason = slurm_cluster.node_state()
    assert "DRAIN" in state
    assert reason.startswith(f"brakeline: Hardware error (GPU XID) (alert {alert.pk})")
    terminate = Command.objects.get(job_id=agent.job_id, kind=CommandKind.TERMINATE)
    assert terminate.status == CommandStatus.SUCCEEDED and terminate.result["by"] == "slurm"
    lines = command_lines(alert.incident)
    assert f"{slurm_cluster.bin_dir}/scancel {slurm_id}" in lines
    drain_line = (
        f"{slurm_cluster.bin_dir}/scontrol update nodename=localhost state=drain "
        f"'reason=brakeline: Hardware error (GPU XID) (alert {alert.pk})'"
    )
    assert drain_line in lines
    node = Node.objects.get(job_id=agent.job_id, hostname=slurm_cluster.node)
    assert node.status == "isolated"

    page = manager.get(f"/api/v1/nodes/{node.pk}").json()
    assert page["state"] == "drained" and page["drain"]["alert"]["id"] == alert.pk
    refused = oncall.post(f"/api/v1/nodes/{node.pk}/resume", {"reason": "looks fine to me"})
    assert refused.status_code == 403 and "manager" in refused.json()["detail"]
    assert "DRAIN" in slurm_cluster.node_state()[0]  # nothing reached Slurm

    returned = manager.post(f"/api/v1/nodes/{node.pk}/resume", {"reason": "GPU reseated"})
    assert returned.status_code == 200, returned.content
    body = returned.json()
    assert body["state"] == "returned" and body["drain"]["returned_by"] == manager.user.username
    # Slurm marks a resumed node not responding until its next ping, about a second.
    wait_for(lambda: slurm_cluster.node_state() == ("IDLE", ""), "the node idle, undrained")
    resume = f"{slurm_cluster.bin_dir}/scontrol update nodename=localhost state=resume"
    assert resume in command_lines(alert.incident)
    row = TimelineEntry.objects.get(incident=alert.incident, data__event="node_returned")
    assert row.actor_id == manager.user.pk and "GPU reseated" in row.message
    assert manager.post(f"/api/v1/nodes/{node.pk}/resume").status_code == 409


def test_a_requeued_job_resumes_from_its_checkpoint_once_the_node_is_back(
    slurm_cluster, live_console, worker, agent
):
    job = Job.objects.select_related("team").get(pk=agent.job_id)
    manager = Api(make_member(job.team, "manager"))
    slurm_id, folder = submit(slurm_cluster, live_console, agent)
    bound_to_slurm(agent, slurm_id)
    SchedulerBinding.objects.filter(job_id=agent.job_id).update(requeue_after_drain=True)
    wait_for(lambda: checkpoint_of(folder).get("step", 0) >= 20, "a checkpoint", timeout=30)
    alert = raise_alert(agent.job_id, "L2")  # say, ECC errors climbing on the node
    first_pid = Job.objects.get(pk=agent.job_id).agent_pid

    response = manager.post(
        f"/api/v1/jobs/{agent.job_id}/isolate-node",
        {"node": slurm_cluster.node, "reason": "ECC errors climbing", "alert_id": alert.pk},
    )
    assert response.status_code == 202, response.content
    drain = wait_for(
        lambda: (
            NodeDrain.objects.filter(node__job_id=agent.job_id, requeued_at__isnull=False)
            .select_related("node")
            .first()
        ),
        "the drain and the requeue",
        timeout=30,
    )
    wait_for(lambda: slurm_cluster.job_state(slurm_id) == "PENDING", "the job to be pending")
    checkpointed = checkpoint_of(folder)["step"]  # the last one before Slurm killed it
    assert slurm_cluster.job_field(slurm_id, "Restarts") == "1"
    lines = command_lines(alert.incident)
    assert lines[-1] == f"{slurm_cluster.bin_dir}/scontrol requeue {slurm_id}"
    assert TimelineEntry.objects.filter(incident=alert.incident, data__event="job_requeued")

    returned = manager.post(f"/api/v1/nodes/{drain.node.pk}/resume", {"reason": "ECC cleared"})
    assert returned.status_code == 200, returned.content
    started = wait_for(
        lambda: (folder / "started-1.json").exists() and folder / "started-1.json",
        "the requeued job to start again",
        timeout=40,
    )
    assert json.loads(started.read_text()) == {"resumed_from": checkpointed}
    assert checkpointed >= 20
    job = wait_for(
        lambda: (
            Job.objects.filter(pk=agent.job_id, last_heartbeat_step__gt=checkpointed)
            .exclude(agent_pid=first_pid)
            .first()
        ),
        "heartbeats of the restarted run",
        timeout=30,
    )
    assert job.status == JobStatus.RUNNING  # the same Brakeline job, watched all along
    assert SchedulerBinding.objects.get(job_id=agent.job_id).slurm_job_id == slurm_id


def test_slurm_refusing_to_return_a_node_is_a_502_on_the_timeline_and_notified(
    slurm_cluster, worker, agent, agent_post, caplog
):
    job = Job.objects.select_related("team").get(pk=agent.job_id)
    manager = Api(make_member(job.team, "manager"))
    submitted = slurm_cluster.run(
        "sbatch", "--parsable", f"--job-name=brakeline-{agent.job_id}", "--wrap=exec sleep 300"
    )
    slurm_id = submitted.stdout.strip().split(";")[0]
    wait_for(lambda: slurm_cluster.job_state(slurm_id) == "RUNNING", "the Slurm job to run")
    beat = {"step": 3, "status": "running", "slurm_job_id": slurm_id, "slurm_nodelist": "localhost"}
    assert agent_post("/api/v1/agent/heartbeat", beat).status_code == 200
    bound_to_slurm(agent, slurm_id)  # once the worker checked it with Slurm
    alert = raise_alert(agent.job_id, "L3")
    manager.post(
        f"/api/v1/jobs/{agent.job_id}/isolate-node",
        {"node": slurm_cluster.node, "reason": "flaky NVLink", "alert_id": alert.pk},
    )
    drain = wait_for(
        lambda: NodeDrain.objects.filter(node__job_id=agent.job_id).first(), "the drain"
    )
    # A cluster administrator resumes the node by hand, outside the console.
    slurm_cluster.run("scontrol", "update", f"nodename={slurm_cluster.node}", "state=resume")

    with caplog.at_level(logging.ERROR, logger="breakers.executors.slurm.executor"):
        response = manager.post(f"/api/v1/nodes/{drain.node_id}/resume")
    assert response.status_code == 502
    assert response.json()["error"] == "scheduler_failed"
    assert "Invalid node state" in response.json()["detail"]
    failed = slurm_calls(alert.incident)[-1]
    assert (failed["ok"], failed["exit_status"]) == (False, 1)
    assert failed["command_line"].endswith("scontrol update nodename=localhost state=resume")
    assert any("NOTIFY: Slurm failed" in record.message for record in caplog.records)
    assert manager.get(f"/api/v1/nodes/{drain.node_id}").json()["state"] == "drained"
