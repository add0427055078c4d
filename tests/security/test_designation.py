"""Agents report, they never designate: each attack of the outside review, refused.

- an inference token naming another team's (or the console's own) HAProxy server;
- a replica restart that would run a uid-65534 process's command line as root;
- checkpoint reports naming /etc/passwd, ``..``, symlinks, ``file://``, another team's bucket
  or path, and a roll back to any of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from breakers.checkpoints import catalogue, roll_back_target
from breakers.models import Checkpoint, CheckpointRoot, InferenceReplica, InferenceServer
from core.errors import InvalidInput
from core.processes import process_start_time, this_host
from incidents.models import Job

pytestmark = pytest.mark.django_db
REPLICA_URL = "/api/v1/agent/replicas/heartbeat"
CHECKPOINT_URL = "/api/v1/agent/checkpoints"
SHA = "c" * 64


def _post(client, token: str, url: str, body: dict):
    return client.post(
        url,
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


# --- Finding 1: an inference token names another team's HAProxy server --------------------------


@pytest.fixture
def two_teams(make_agent):
    a = make_agent(team="team-a", name="a-api", kind="inference")
    b = make_agent(team="team-b", name="b-api", kind="inference")
    InferenceServer.objects.create(job_id=a.job_id, backend="team-a-models", server="a-1")
    InferenceServer.objects.create(job_id=b.job_id, backend="team-b-models", server="b-prod-1")
    return a, b


@pytest.mark.parametrize(
    ("backend", "replica"),
    [("team-b-models", "b-prod-1"), ("brakeline-web", "console-1"), ("team-a-models", "a-2")],
)
def test_an_inference_token_cannot_name_a_server_not_declared_for_its_job(
    client, two_teams, backend, replica
):
    a, _ = two_teams
    for healthy in (True, False):
        body = {"replica": replica, "backend": backend, "pid": 4242, "healthy": healthy}
        answer = _post(client, a.token, REPLICA_URL, body)
        assert answer.status_code == 400, answer.content
        assert "replica" in answer.json()["fields"]
    assert not InferenceReplica.objects.exists()  # nothing written, nothing drained


def test_a_replica_row_naming_a_foreign_server_is_never_drained(two_teams, settings, haproxy):
    from breakers.control.inference import recover_replica
    from breakers.models import ReplicaStatus

    a, _ = two_teams
    settings.HAPROXY_SOCKET = haproxy.address
    # A row as the old intake would have written it: job A's replica, team B's server.
    replica = InferenceReplica.objects.create(
        job_id=a.job_id, name="b-prod-1", backend="team-b-models", status="draining"
    )
    recover_replica(replica.pk)
    replica.refresh_from_db()
    assert replica.status == ReplicaStatus.FAILED
    assert haproxy.commands == []  # nothing reached the load balancer


def test_the_declared_server_is_still_reported_and_acted_on(client, two_teams):
    a, _ = two_teams
    body = {"replica": "a-1", "backend": "team-a-models", "pid": 4242, "healthy": True}
    assert _post(client, a.token, REPLICA_URL, body).status_code == 200


# --- Finding 3: a restart never runs with more privilege than the process it replaces -------


def _uid_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as uid 65534 needs root")
def test_a_replica_restart_runs_as_the_replaced_process_uid_not_the_workers(make_agent, tmp_path):
    from breakers.executors.restart import restart_replica

    agent = make_agent(team="team-a", name="nobody-api", kind="inference")
    env = {"PATH": "/usr/bin:/bin", "BRAKELINE_TOKEN": agent.token}
    victim = subprocess.Popen(
        ["/bin/sleep", "300"],
        env=env,
        cwd="/",
        user=65534,
        group=65534,
        extra_groups=[],
        start_new_session=True,
    )
    new_pid = None
    try:
        replica = InferenceReplica.objects.create(
            job_id=agent.job_id,
            name="r1",
            backend="models",
            hostname=this_host(),
            pid=victim.pid,
            pid_start_time=process_start_time(victim.pid),
        )
        outcome = restart_replica(replica, grace_seconds=5.0)
        victim.wait(10)
        assert outcome.stopped, outcome
        new_pid = int(outcome.detail)
        assert _uid_of(new_pid) == 65534  # not the worker's uid 0
    finally:
        for pid in (victim.pid, new_pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)


# --- Finding 7: the checkpoint catalogue takes only paths under the job's declared root -------


@pytest.fixture
def rooted(make_agent, tmp_path, settings):
    settings.CHECKPOINT_ROOT = ""  # no operator default: the teams' own roots only
    a = make_agent(team="team-a", name="a-train")
    b = make_agent(team="team-b", name="b-train")
    roots = {}
    for agent, name in ((a, "a"), (b, "b")):
        root = tmp_path / f"team-{name}"
        (root / "run").mkdir(parents=True)
        team_id = Job.objects.get(pk=agent.job_id).team_id
        CheckpointRoot.objects.create(team_id=team_id, root=str(root))
        roots[name] = root
    (roots["a"] / "escape").symlink_to("/etc")
    return a, b, roots


def test_a_checkpoint_outside_the_declared_root_is_a_400_naming_the_field(client, rooted):
    a, _, roots = rooted
    hostile = [
        "/etc/passwd",
        f"{roots['a']}/../team-b/run/step-1.pt",
        f"{roots['a']}/escape/passwd",
        f"file://{roots['a']}/run/step-1.pt",
        "s3://other-team-bucket/step-1.pt",
        f"{roots['b']}/run/step-1.pt",
        "relative/step-1.pt",
    ]
    for path in hostile:
        answer = _post(client, a.token, CHECKPOINT_URL, {"path": path, "sha256": SHA, "step": 1})
        assert answer.status_code == 400, (path, answer.content)
        assert "path" in answer.json()["fields"], path
    assert not Checkpoint.objects.exists()
    good = {"path": f"{roots['a']}/run/step-2.pt", "sha256": SHA, "step": 2}
    assert _post(client, a.token, CHECKPOINT_URL, good).status_code == 201


def test_a_job_without_a_declared_root_cannot_report_checkpoints(client, make_agent, settings):
    settings.CHECKPOINT_ROOT = ""
    agent = make_agent(team="team-c", name="c-train")
    body = {"path": "/data/c/step-1.pt", "sha256": SHA, "step": 1}
    answer = _post(client, agent.token, CHECKPOINT_URL, body)
    assert answer.status_code == 400 and "root" in answer.json()["fields"]["path"]


def test_a_roll_back_offers_and_accepts_only_entries_under_the_root(rooted):
    a, _, roots = rooted
    inside = Checkpoint.objects.create(
        job_id=a.job_id, path=f"{roots['a']}/run/step-5.pt", sha256=SHA, step=5, reported_at=_now()
    )
    # An entry written before the root was declared (or by the old intake): /etc/passwd with a
    # low step, which the old catalogue preselected as the clean one.
    outside = Checkpoint.objects.create(
        job_id=a.job_id, path="/etc/passwd", sha256=SHA, step=1, reported_at=_now()
    )
    assert [entry["id"] for entry in catalogue(a.job_id)] == [inside.pk]
    with pytest.raises(InvalidInput) as refused:
        roll_back_target(a.job_id, str(outside.pk))
    assert "checkpoint" in refused.value.fields
    assert roll_back_target(a.job_id, str(inside.pk)) == inside


def _now():
    from django.utils import timezone

    return timezone.now()


@pytest.mark.parametrize(
    ("worker", "process", "refused"),
    [
        ((1000, 1000), (1000, 1000), False),  # the worker's own user: it may restart it
        ((1000, 1000), (65534, 65534), True),  # another user: it cannot take that identity
        ((1000, 1000), (1000, 0), True),  # same uid, another group
    ],
)
def test_a_worker_that_cannot_take_the_processs_identity_refuses(
    monkeypatch, worker, process, refused
):
    from breakers.executors import targets

    monkeypatch.setattr(targets.os, "geteuid", lambda: worker[0])
    monkeypatch.setattr(targets.os, "getuid", lambda: worker[0])
    monkeypatch.setattr(targets.os, "getgid", lambda: worker[1])
    monkeypatch.setattr(targets.os, "getgroups", lambda: [])
    identity = targets.ProcessIdentity(process[0], process[1], ())
    monkeypatch.setattr(targets, "process_identity", lambda pid: identity)
    answer = targets.restart_identity(4242)
    assert isinstance(answer, str) is refused
