"""The people's snapshot API and page: scoping, hostile parameters, the resume kind's intake."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from breakers.models import EnvironmentSnapshot
from breakers.snapshots.resume import RESUME_RULE_KEY
from incidents.models import Alert
from tests.support.authz import make_member

pytestmark = pytest.mark.django_db
NOW = datetime.now(UTC)
SHA = "cd" * 32


def document(seconds: int, **sections):
    return {
        "taken_at": (NOW + timedelta(seconds=seconds)).isoformat(),
        "packages": {"torch": "2.13.0"},
        "seeds": {"python": 1},
        "data_position": {"epoch": 0, "batch_in_epoch": 4},
        **sections,
    }


def send(agent_post, kind, seconds, checkpoint=True, **sections):
    body = {"kind": kind, "step": 4, "snapshot": document(seconds, **sections)}
    if checkpoint:
        body["checkpoint"] = {"path": "/ckpt/step-4.pt", "sha256": SHA}
    return agent_post("/api/v1/agent/snapshots", body)


@pytest.fixture
def viewer(client, agent):
    from incidents.models import Job

    client.force_login(make_member(Job.objects.get(pk=agent.job_id).team, "viewer"))
    return client


def test_a_resume_needs_its_checkpoint(agent_post):
    answer = send(agent_post, "resume", 1, checkpoint=False)
    assert answer.status_code == 400
    assert "required for kind 'resume'" in answer.json()["fields"]["checkpoint"]
    assert not EnvironmentSnapshot.objects.exists()


def test_a_resume_with_the_same_environment_raises_nothing(agent_post, agent):
    assert send(agent_post, "checkpoint", 0).status_code == 201
    assert send(agent_post, "resume", 5).status_code == 201
    assert not Alert.objects.filter(rule_key=RESUME_RULE_KEY).exists()


def test_a_resume_sent_twice_raises_one_alert(agent_post, agent):
    send(agent_post, "checkpoint", 0)
    first = send(agent_post, "resume", 5, packages={"torch": "2.12.0"})
    again = send(agent_post, "resume", 5, packages={"torch": "2.12.0"})
    assert (first.status_code, again.status_code) == (201, 200)
    alert = Alert.objects.get(job_id=agent.job_id, rule_key=RESUME_RULE_KEY)
    assert alert.description == (
        "environment changed across resume: packages (torch 2.13.0 → 2.12.0)"
    )


def test_a_resume_of_an_unknown_checkpoint_raises_nothing(agent_post):
    assert send(agent_post, "resume", 5, seeds={"python": 9}).status_code == 201
    assert not Alert.objects.exists()


@pytest.mark.parametrize(
    ("query", "status", "field"),
    [
        ("?a=1", 400, "b"),
        ("?a=x&b=1", 400, "a"),
        ("?a=1&b=99999999999999999999", 400, "b"),
        ("?diff=sideways", 400, "diff"),
        ("?a=424242&b=424243", 404, None),
    ],
)
def test_hostile_diff_parameters(viewer, agent, agent_post, query, status, field):
    send(agent_post, "checkpoint", 0)
    answer = viewer.get(f"/api/v1/jobs/{agent.job_id}/snapshots/diff{query}")
    assert answer.status_code == status
    if field:
        assert field in answer.json()["fields"]
    page = viewer.get(f"/jobs/{agent.job_id}/snapshots/{query}")
    assert page.status_code in (400, 404) or page.status_code == 200
    assert page.status_code != 500


def test_another_jobs_snapshot_is_not_found(viewer, agent, agent_post, make_agent, client):
    other = make_agent(name="other")
    stranger = client.post(
        "/api/v1/agent/snapshots",
        json.dumps({"kind": "start", "step": 0, "snapshot": document(0)}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {other.token}"},
    ).json()["id"]
    mine = send(agent_post, "checkpoint", 0).json()["id"]
    answer = viewer.get(f"/api/v1/jobs/{agent.job_id}/snapshots/diff?a={mine}&b={stranger}")
    assert answer.status_code == 404


def test_another_teams_job_is_a_404(client, make_agent):
    from incidents.models import Team

    theirs = make_agent(team="elsewhere", name="theirs")
    client.force_login(make_member(Team.objects.get_or_create(name="mine")[0], "admin"))
    for path in ("snapshots", "snapshots/diff", "readiness"):
        assert client.get(f"/api/v1/jobs/{theirs.job_id}/{path}").status_code == 404
    assert client.get(f"/jobs/{theirs.job_id}/snapshots/").status_code == 404


def test_list_diff_and_readiness(viewer, agent, agent_post):
    send(agent_post, "checkpoint", 0)
    send(agent_post, "resume", 5, seeds={"python": 2})
    listed = viewer.get(f"/api/v1/jobs/{agent.job_id}/snapshots").json()["snapshots"]
    assert [row["kind"] for row in listed] == ["resume", "checkpoint"]
    diff = viewer.get(f"/api/v1/jobs/{agent.job_id}/snapshots/diff").json()
    assert diff["chosen"] == "resume" and diff["resume_critical"] == ["seeds"]
    latest = viewer.get(f"/api/v1/jobs/{agent.job_id}/snapshots/diff?diff=latest").json()
    assert latest["chosen"] == "latest"
    readiness = viewer.get(f"/api/v1/jobs/{agent.job_id}/readiness").json()
    assert readiness["grade"] in ("ready", "at risk", "not ready")
    assert {item["key"] for item in readiness["items"]} >= {"image", "seeds", "shm"}


def test_fewer_than_two_snapshots_is_a_404_and_a_sentence_on_the_page(viewer, agent):
    answer = viewer.get(f"/api/v1/jobs/{agent.job_id}/snapshots/diff")
    assert answer.status_code == 404 and "fewer than two" in answer.json()["detail"]
    page = viewer.get(f"/jobs/{agent.job_id}/snapshots/").content.decode()
    assert "nothing to compare yet" in page and "Sandbox readiness" in page
