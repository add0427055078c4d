"""Declaring a job's servers and checkpoint root: team admins only, 400 naming the field,
409 for another team's server or root, 404 outside the user's teams."""

from __future__ import annotations

import pytest

from breakers.models import CheckpointRoot, InferenceServer
from incidents.jobs import create_job

pytestmark = pytest.mark.django_db


def test_a_team_admin_declares_the_servers_and_nobody_else_may(scene):
    url = f"/api/v1/jobs/{scene.job_id}/inference-servers"
    body = {"servers": [{"backend": "models", "server": "r1"}]}
    assert scene.api("manager").put(url, body).status_code == 403
    assert scene.api(None).put(url, body).status_code == 404
    answer = scene.api("admin").put(url, body)
    assert answer.status_code == 200 and answer.json() == body
    assert scene.api("viewer").get(url).json() == body


def test_bad_servers_are_named_and_another_jobs_server_is_a_conflict(scene):
    url = f"/api/v1/jobs/{scene.job_id}/inference-servers"
    admin = scene.api("admin")
    bad = admin.put(url, {"servers": [{"backend": "b; shutdown", "server": "r1"}]})
    assert bad.status_code == 400 and "servers[0]" in bad.json()["fields"]
    other = create_job("other-team", "their-api", "inference").job
    InferenceServer.objects.create(job=other, backend="theirs", server="t1")
    clash = admin.put(url, {"servers": [{"backend": "theirs", "server": "t1"}]})
    assert clash.status_code == 409
    assert not InferenceServer.objects.filter(job_id=scene.job_id).exists()


def test_a_team_admin_declares_the_checkpoint_root(scene, tmp_path):
    url = f"/api/v1/teams/{scene.team.pk}/checkpoint-root"
    admin = scene.api("admin")
    assert scene.api("manager").put(url, {"root": str(tmp_path)}).status_code == 403
    for root in (
        "relative/dir",
        "/data/../etc",
        "file:///data",
        "ftp://x/y",
        "/d/\ud800",
        "s3://b/\ud800",
    ):
        answer = admin.put(url, {"root": root})
        assert answer.status_code == 400 and "root" in answer.json()["fields"], root
    answer = admin.put(url, {"root": str(tmp_path / "ckpt")})
    assert answer.status_code == 200 and answer.json()["root"] == str(tmp_path / "ckpt")
    job_url = f"/api/v1/jobs/{scene.job_id}/checkpoint-root"
    assert scene.api("viewer").get(job_url).json()["effective"] == str(tmp_path / "ckpt")


def test_a_root_overlapping_another_teams_is_a_conflict(scene, tmp_path):
    other = create_job("other-team", "their-train").job
    CheckpointRoot.objects.create(team=other.team, root=str(tmp_path / "theirs"))
    url = f"/api/v1/teams/{scene.team.pk}/checkpoint-root"
    for root in (tmp_path, tmp_path / "theirs", tmp_path / "theirs" / "inside"):
        assert scene.api("admin").put(url, {"root": str(root)}).status_code == 409, root
