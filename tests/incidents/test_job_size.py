"""What a job occupies: declared by a manager (create_job, the API, the admin) or reported by
the job (its ranks' hosts, the accelerators its snapshot saw); a declared size always wins, and
a review's accelerator-hours say which they were computed from."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from brakeline.snapshot import take_snapshot
from breakers.snapshots.intake import record_snapshot
from core.errors import InvalidInput
from incidents.job_size import declare_job_size, parse_job_size, report_job_size
from incidents.models import Job, JobRank, JobSize

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({"nodes": 0, "gpus_per_node": 8}, {"nodes"}),
        ({"nodes": 2, "gpus_per_node": -1}, {"gpus_per_node"}),
        ({"nodes": True, "gpus_per_node": 8}, {"nodes"}),
        ({"nodes": 2.5, "gpus_per_node": 8}, {"nodes"}),
        ({"nodes": "2", "gpus_per_node": 8}, {"nodes"}),
        ({"gpus_per_node": 8}, {"nodes"}),
        ({"nodes": 2, "gpus_per_node": 8, "accelerator": 7}, {"accelerator"}),
        ({"nodes": 2, "gpus_per_node": 8, "accelerator": "H" * 101}, {"accelerator"}),
        ({"nodes": 2, "gpus_per_node": 8, "accelerator": "H\x00"}, {"accelerator"}),
        ({"nodes": 2, "gpus_per_node": 8, "racks": 1}, {"racks"}),
        ({"nodes": 10**9, "gpus_per_node": 10**9}, {"nodes", "gpus_per_node"}),
    ],
)
def test_a_bad_size_is_refused_naming_each_field(body, fields):
    with pytest.raises(InvalidInput) as refused:
        parse_job_size(body)
    assert set(refused.value.fields) == fields


def test_a_reported_size_never_replaces_a_declared_one(make_agent):
    job_id = make_agent(team="vision", name="vit").job_id
    report_job_size(job_id, nodes=2, per_node=4, accelerator="A100")
    assert JobSize.objects.get(job_id=job_id).source == "reported"
    declare_job_size(job_id, nodes=4, gpus_per_node=8, accelerator="H100")
    report_job_size(job_id, nodes=2, per_node=4, accelerator="A100")
    size = JobSize.objects.get(job_id=job_id)
    assert (size.nodes, size.gpus_per_node, size.accelerator, size.source) == (
        4,
        8,
        "H100",
        "declared",
    )


def _snapshot_seeing(accelerators: int) -> bytes:
    snapshot = json.loads(json.dumps(take_snapshot(seeds={"torch": 7}, environ={})))
    devices = [{"name": "H100 80GB", "memory_bytes": 80 * 2**30}] * accelerators
    snapshot["resources"]["accelerators"] = devices
    return json.dumps({"kind": "start", "step": 0, "snapshot": snapshot}).encode()


def test_the_job_reports_its_hosts_and_the_accelerators_it_saw(make_agent):
    job_id = make_agent(team="vision", name="vit").job_id
    for rank, host in enumerate(["gpu-1", "gpu-1", "gpu-2", "gpu-2"]):
        JobRank.objects.create(
            job_id=job_id, rank=rank, hostname=host, step=0, last_heartbeat_at=timezone.now()
        )
    record_snapshot(job_id, _snapshot_seeing(8))
    size = JobSize.objects.get(job_id=job_id)
    assert (size.nodes, size.gpus_per_node, size.accelerator, size.source) == (
        2,
        8,
        "H100 80GB",
        "reported",
    )


def test_a_job_that_saw_no_accelerator_reports_no_size(make_agent):
    job_id = make_agent(team="vision", name="cpu").job_id
    record_snapshot(job_id, _snapshot_seeing(0))
    assert not JobSize.objects.filter(job_id=job_id).exists()


def test_create_job_declares_the_size_and_refuses_a_bad_one_before_creating():
    out = StringIO()
    call_command(
        "create_job",
        "--team",
        "vision",
        "--name",
        "vit",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--accelerator",
        "H100",
        stdout=out,
    )
    size = JobSize.objects.get(job__name="vit")
    assert (size.nodes, size.gpus_per_node, size.source) == (2, 8, "declared")
    with pytest.raises(CommandError, match="gpus_per_node"):
        call_command("create_job", "--team", "vision", "--name", "bad", "--nodes", "2")
    assert not Job.objects.filter(name="bad").exists()


def test_a_manager_declares_the_size_through_the_api(scene):
    url = f"/api/v1/jobs/{scene.job_id}/size"
    body = {"nodes": 2, "gpus_per_node": 8, "accelerator": "H100"}
    assert scene.api("viewer").get(url).json() == {"size": None}
    assert scene.api("oncall").put(url, body).status_code == 403
    assert scene.api(None).put(url, body).status_code == 404
    bad = scene.api("manager").put(url, {"nodes": 0, "gpus_per_node": 8})
    assert bad.status_code == 400 and "nodes" in bad.json()["fields"]
    assert not JobSize.objects.filter(job_id=scene.job_id).exists()
    answer = scene.api("manager").put(url, body)
    assert answer.status_code == 200
    assert answer.json()["size"] == {**body, "accelerators": 16, "source": "declared"}
