"""OpenAPI schema and docs, login, and the first dashboard page with team scoping."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from incidents.models import Membership, Role, Team

pytestmark = pytest.mark.django_db


def test_openapi_schema_describes_the_agent_protocol(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    schema = response.json()
    metrics = schema["paths"]["/api/v1/agent/metrics"]["post"]
    assert set(metrics["responses"]) >= {"202", "400", "401", "413", "429"}
    assert "/api/v1/agent/heartbeat" in schema["paths"]


def test_api_docs_are_served_without_outside_assets(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    assert b"swagger" in response.content.lower()
    assert b"cdn." not in response.content


@pytest.fixture
def member(db):
    def make(username: str, team: str, role: str = Role.VIEWER):
        user = get_user_model().objects.create_user(username, password="pw-for-tests")
        Membership.objects.create(
            user=user, team=Team.objects.get_or_create(name=team)[0], role=role
        )
        return user

    return make


def test_the_dashboard_needs_a_login(client):
    response = client.get("/")
    assert response.status_code == 302 and response.url.startswith("/login/")


def test_the_dashboard_lists_only_my_teams_jobs(client, member, make_agent, agent_post):
    mine = make_agent(team="vision", name="vit")
    make_agent(team="secret", name="hidden-run")
    client.force_login(member("ana", "vision"))
    client.post(
        "/api/v1/agent/metrics",
        data={"points": [{"name": "loss", "step": 3, "value": 1.25}]},
        content_type="application/json",
        headers=mine.headers,
    )
    page = client.get("/")
    assert page.status_code == 200
    assert b"vit" in page.content and b"hidden-run" not in page.content
    jobs = client.get("/api/v1/jobs").json()
    assert [(j["name"], j["latest_loss"], j["current_step"]) for j in jobs] == [("vit", 1.25, 3)]


def test_another_teams_job_is_404_not_403(client, member, make_agent):
    other = make_agent(team="secret", name="hidden-run")
    client.force_login(member("ana", "vision"))
    response = client.get(f"/api/v1/jobs/{other.job_id}")
    assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_a_nan_loss_is_shown_as_nan(client, member, make_agent):
    job = make_agent(team="vision", name="vit")
    client.force_login(member("ana", "vision"))
    client.post(
        "/api/v1/agent/metrics",
        data='{"points": [{"name": "loss", "step": 1, "value": NaN}]}',
        content_type="application/json",
        headers=job.headers,
    )
    assert client.get(f"/api/v1/jobs/{job.job_id}").json()["latest_loss"] == "NaN"


def test_login_with_the_form(client, member):
    member("ana", "vision")
    response = client.post("/login/", {"username": "ana", "password": "pw-for-tests"})
    assert response.status_code == 302 and response.url == "/"
    assert client.get("/").status_code == 200


def test_the_schema_says_what_the_responses_and_the_refusals_say(client):
    """latest_loss and point values are numbers or the three spellings (never null for a
    value); pid, rank and step carry the bounds the protocol enforces."""
    import yaml

    schema = yaml.safe_load(client.get("/api/schema/").content)
    parts = schema["components"]["schemas"]
    spelled = {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}
    assert spelled in parts["MetricPointDoc"]["properties"]["value"]["oneOf"]
    assert "value" in parts["MetricPointDoc"]["required"]
    assert spelled in parts["Job"]["properties"]["latest_loss"]["oneOf"]
    heartbeat = parts["HeartbeatDoc"]["properties"]
    assert (heartbeat["pid"]["minimum"], heartbeat["pid"]["maximum"]) == (1, 2**31 - 1)
    assert heartbeat["rank"]["maximum"] == 2**31 - 1
    assert heartbeat["step"]["maximum"] == 2**53


def test_the_schema_documents_the_bounds_of_limit_and_max_points(client):
    import yaml

    schema = yaml.safe_load(client.get("/api/schema/").content)

    def parameter(path: str, name: str) -> dict:
        (found,) = [p for p in schema["paths"][path]["get"]["parameters"] if p["name"] == name]
        return found["schema"]

    for path in ("/api/v1/alerts", "/api/v1/audit", "/api/v1/escalations"):
        assert parameter(path, "limit") == {"type": "integer", "minimum": 1, "maximum": 500}
    bounds = parameter("/api/v1/jobs/{id}/series", "max_points")
    assert (bounds["minimum"], bounds["maximum"]) == (2, 10_000)
