"""Jobs bound to Slurm by their heartbeats, routing to Slurm, failures, the node API — the parts
that need no running Slurm (tests/breakers/slurm/ runs a real one)."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
from django.utils import timezone

from breakers.agent.protocol import parse_heartbeat
from breakers.control.commands import expire_overdue_commands, issue_command, stop_hung_job
from breakers.executors.scheduler import executor_for
from breakers.executors.slurm import executor as slurm
from breakers.executors.slurm.actions import act_on_command
from breakers.executors.slurm.client import SlurmCall
from breakers.executors.slurm.executor import SlurmExecutor
from breakers.models import NodeDrain, SchedulerBinding
from core.errors import InvalidInput
from incidents.heartbeats import record_heartbeat
from incidents.jobs import create_job
from incidents.models import Incident, Job, JobStatus, Node, TimelineEntry
from tests.support.authz import Api, make_member, raise_alert

HEARTBEAT = "/api/v1/agent/heartbeat"
SLURM_BEAT = {
    "step": 3,
    "status": "running",
    "hostname": "gpu01",
    "rank": 0,
    "slurm_job_id": "41",
    "slurm_nodelist": "gpu[01-02]",
}


def test_a_heartbeat_may_carry_the_slurm_context():
    beat = parse_heartbeat(json.dumps({**SLURM_BEAT, "slurm_step_id": "0"}).encode())
    assert (beat.slurm_job_id, beat.slurm_nodelist, beat.slurm_step_id) == ("41", "gpu[01-02]", "0")
    assert parse_heartbeat(b'{"step": 1, "status": "running", "slurm_job_id": 41}').slurm_job_id
    plain = parse_heartbeat(b'{"step": 1, "status": "running"}')
    assert (plain.slurm_job_id, plain.slurm_nodelist, plain.slurm_step_id) == ("", "", "")


@pytest.mark.parametrize(
    "field, value",
    [
        ("slurm_job_id", "41a"),
        ("slurm_job_id", -1),
        ("slurm_job_id", True),
        ("slurm_step_id", "0; reboot"),
        ("slurm_nodelist", 5),
        ("slurm_nodelist", "n" * 1001),
        ("slurm_jobid", "41"),  # a typo is refused, not ignored
    ],
)
def test_a_malformed_slurm_context_is_refused(field, value):
    with pytest.raises(InvalidInput) as refused:
        parse_heartbeat(json.dumps({"step": 1, "status": "running", field: value}).encode())
    assert field in refused.value.fields


@pytest.fixture
def beat(agent_post, django_capture_on_commit_callbacks, request):
    """POST a heartbeat; the worker's Slurm check it queues (a new context) runs right away."""
    from config.celery import app

    was_eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    request.addfinalizer(lambda: setattr(app.conf, "task_always_eager", was_eager))

    def post(body):
        with django_capture_on_commit_callbacks(execute=True):
            return agent_post(HEARTBEAT, body)

    return post


@pytest.fixture
def slurm_knows(monkeypatch):
    """A stand-in for ``scontrol show job``: Slurm knows these jobs (id → name, nodelist)."""
    known: dict[str, tuple[str, str]] = {}

    def show_job(slurm_job_id: str):
        call = SlurmCall(("scontrol", "show", "job", slurm_job_id), 0, "", "", 0.0)
        if slurm_job_id not in known:
            failed = SlurmCall(call.argv, 1, "", "Invalid job id specified", 0.0)
            return None, failed
        name, nodelist = known[slurm_job_id]
        return slurm.SlurmJob(slurm_job_id, "RUNNING", name, "", nodelist), call

    monkeypatch.setattr(slurm, "show_job", show_job)
    return known


@pytest.mark.django_db
def test_heartbeats_with_a_slurm_job_id_bind_the_job_to_slurm(agent, beat, slurm_knows):
    mine = (f"brakeline-{agent.job_id}", "gpu[01-02]")
    slurm_knows.update({"41": mine, "42": mine})
    job = Job.objects.get(pk=agent.job_id)
    assert executor_for(job).name == "local"
    assert beat(SLURM_BEAT).status_code == 200
    binding = SchedulerBinding.objects.get(job_id=agent.job_id)
    assert (binding.executor, binding.slurm_job_id, binding.slurm_nodelist) == (
        "slurm",
        "41",
        "gpu[01-02]",
    )
    assert (binding.hostname, binding.rank) == ("gpu01", 0)
    assert isinstance(executor_for(job), SlurmExecutor)

    written = binding.updated_at
    beat({**SLURM_BEAT, "hostname": "gpu02", "rank": 1})  # another rank
    binding.refresh_from_db()
    assert binding.updated_at == written and binding.hostname == "gpu01"

    beat({**SLURM_BEAT, "slurm_job_id": "42"})  # submitted again
    assert SchedulerBinding.objects.get(job_id=agent.job_id).slurm_job_id == "42"
    beat({"step": 4, "status": "running"})  # now run outside Slurm
    assert executor_for(job).name == "local"


@pytest.mark.django_db
def test_a_slurm_job_slurm_does_not_confirm_is_not_bound(agent, beat, slurm_knows):
    slurm_knows["41"] = ("someone-elses-job", "gpu[01-02]")
    slurm_knows["43"] = (f"brakeline-{agent.job_id}", "gpu07")
    for body in (
        SLURM_BEAT,  # not submitted for this job
        {**SLURM_BEAT, "slurm_job_id": "43"},  # this job's, but not on the reported nodes
        {**SLURM_BEAT, "slurm_job_id": "44"},  # unknown to Slurm
    ):
        assert beat(body).status_code == 200
    assert not SchedulerBinding.objects.filter(job_id=agent.job_id).exists()
    assert executor_for(Job.objects.get(pk=agent.job_id)).name == "local"


@pytest.mark.django_db
def test_an_executor_chosen_by_a_person_stays(agent, beat, slurm_knows):
    slurm_knows["41"] = (f"brakeline-{agent.job_id}", "gpu[01-02]")
    SchedulerBinding.objects.create(job_id=agent.job_id, executor="local", executor_pinned=True)
    beat(SLURM_BEAT)
    binding = SchedulerBinding.objects.get(job_id=agent.job_id)
    assert (binding.executor, binding.slurm_job_id) == ("local", "41")


def bind(job_id: int, slurm_job_id: str = "7") -> SchedulerBinding:
    return SchedulerBinding.objects.create(
        job_id=job_id, executor="slurm", slurm_job_id=slurm_job_id, slurm_nodelist="gpu01"
    )


def routed(callbacks) -> int:
    return sum("route_to_scheduler" in callback.__qualname__ for callback in callbacks)


@pytest.mark.django_db
def test_drains_and_l4_cancels_of_slurm_jobs_go_to_slurm_after_commit(
    make_agent, django_capture_on_commit_callbacks
):
    on_slurm, local = make_agent(), make_agent()
    bind(on_slurm.job_id)
    with django_capture_on_commit_callbacks() as callbacks:
        issue_command(on_slurm.job_id, "isolate_node", reason="XID", params={"node": "gpu01"})
        issue_command(on_slurm.job_id, "terminate", reason="XID", severity="L4")
    assert routed(callbacks) == 2
    with django_capture_on_commit_callbacks() as callbacks:
        issue_command(on_slurm.job_id, "lower_lr", reason="L2", params={"factor": 0.5})
        issue_command(local.job_id, "isolate_node", reason="XID", params={"node": "gpu01"})
        issue_command(local.job_id, "terminate", reason="XID", severity="L4")
    assert routed(callbacks) == 0
    person_s = make_agent()  # on_slurm has its terminate on its way: one at a time
    bind(person_s.job_id)
    with django_capture_on_commit_callbacks() as callbacks:
        # A person's terminate without an L4 is the job's to carry out (the executor only
        # steps in when it does not answer in time).
        issue_command(person_s.job_id, "terminate", reason="done", idempotency_key="person")
    assert routed(callbacks) == 0


def failed_calls(incident: Incident) -> list[dict]:
    rows = TimelineEntry.objects.filter(incident=incident, data__event="slurm_call")
    return [row.data for row in rows if not row.data["ok"]]


@pytest.mark.django_db
def test_a_drain_slurm_cannot_run_raises_the_incident_to_l4_and_notifies(
    agent, settings, tmp_path, caplog, django_capture_on_commit_callbacks
):
    settings.SLURM_BIN_DIR = str(tmp_path)  # a wrong setting: no Slurm binaries there
    bind(agent.job_id)
    alert = raise_alert(agent.job_id, "L3")
    command = issue_command(
        agent.job_id, "isolate_node", reason="NVLink", params={"node": "gpu01"}, alert_id=alert.pk
    ).command
    with (
        caplog.at_level(logging.ERROR, logger="breakers.executors.slurm.executor"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        act_on_command(command.pk)
    incident = Incident.objects.get(pk=alert.incident_id)
    [failed] = failed_calls(incident)  # the check of the Slurm job, before any drain
    assert failed["command_line"] == f"{tmp_path}/scontrol show job -o 7"
    assert failed["exit_status"] is None and "FileNotFoundError" in failed["stderr"]
    assert incident.level == "L4"
    assert incident.timeline.filter(kind="severity_changed", message__contains="L3 → L4")
    assert any("NOTIFY: Slurm failed" in record.message for record in caplog.records)
    assert not NodeDrain.objects.exists()
    command.refresh_from_db()
    assert command.status == "pending"  # nobody pretends it was done


@pytest.mark.django_db
def test_a_hung_job_slurm_cannot_reach_is_not_reported_stopped(agent, settings, tmp_path):
    settings.SLURM_BIN_DIR = str(tmp_path)
    bind(agent.job_id)
    record_heartbeat(agent.job_id, step=5, status="running")
    alert = raise_alert(agent.job_id, "L3")
    command = issue_command(
        agent.job_id, "checkpoint_and_pause", reason="hung", alert_id=alert.pk
    ).command
    assert expire_overdue_commands(timezone.now() + timedelta(hours=1)) == [command.pk]
    outcome = stop_hung_job(command.pk, grace_seconds=0.1)
    assert outcome.executor == "slurm" and not outcome.stopped
    assert Job.objects.get(pk=agent.job_id).status != JobStatus.TERMINATED
    incident = Incident.objects.get(pk=alert.incident_id)
    # Slurm cannot even be asked whether job 7 is this job's, so nothing is cancelled.
    assert any("scontrol show job" in call["command_line"] for call in failed_calls(incident))
    assert "could not be asked" in outcome.detail
    assert incident.level == "L4"


@pytest.mark.django_db
def test_the_node_api_shows_a_node_to_its_team_only(agent):
    job = Job.objects.select_related("team").get(pk=agent.job_id)
    node = Node.objects.create(job=job, hostname="gpu01")
    viewer = Api(make_member(job.team, "viewer"))
    page = viewer.get(f"/api/v1/nodes/{node.pk}")
    assert page.status_code == 200
    assert (page.json()["state"], page.json()["drain"], page.json()["scheduler"]) == (
        "healthy",
        None,
        None,
    )
    stranger = Api(make_member(create_job("other-team", "x").job.team, "admin"))
    assert stranger.get(f"/api/v1/nodes/{node.pk}").status_code == 404
    assert stranger.post(f"/api/v1/nodes/{node.pk}/resume").status_code == 404


@pytest.mark.django_db
def test_only_a_manager_returns_a_node_and_only_one_brakeline_drained(agent):
    job = Job.objects.select_related("team").get(pk=agent.job_id)
    node = Node.objects.create(job=job, hostname="gpu01")
    NodeDrain.objects.create(
        node=node, slurm_node="gpu01", reason="brakeline: test", drained_at=timezone.now()
    )
    refused = Api(make_member(job.team, "oncall")).post(f"/api/v1/nodes/{node.pk}/resume")
    assert refused.status_code == 403
    assert "Only a manager or above" in refused.json()["detail"]
    assert NodeDrain.objects.get(node=node).returned_at is None
    healthy = Node.objects.create(job=job, hostname="gpu02")
    manager = Api(make_member(job.team, "manager"))
    assert manager.post(f"/api/v1/nodes/{healthy.pk}/resume").status_code == 409
