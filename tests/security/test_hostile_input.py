"""Finding 5 (input): ids of 2**63 and more in paths, odd digits (²) and NUL characters in
query strings and bodies were 500s on the people API. Now 400 or 404, with the refusal's audit
row kept; and an /api/ path that matches no route is a JSON 404, not Django's HTML page."""

from __future__ import annotations

import json

import pytest

from incidents.models import AuditEntry

HUGE = [2**63, 2**63 + 1, 2**64, 10**30]


def send(api, method: str, path: str, body: dict | None = None, **params):
    client = getattr(api.client, method)
    if method == "get":
        return client(path, params, headers=api.headers)
    return client(
        path, json.dumps(body or {}), content_type="application/json", headers=api.headers
    )


GETS = [
    "/api/v1/jobs/{id}",
    "/api/v1/jobs/{id}/series",
    "/api/v1/jobs/{id}/markers",
    "/api/v1/alerts/{id}",
    "/api/v1/alerts/{id}/deliveries",
    "/api/v1/escalations/{id}",
    "/api/v1/incidents/{id}/review",
    "/api/v1/incidents/{id}/review.json",
    "/api/v1/teams/{id}/shifts",
    "/api/v1/teams/{id}/oncall",
    "/api/v1/teams/{id}/notification-policy",
    "/api/v1/teams/{id}/incident-report",
    "/api/v1/nodes/{id}",
]
POSTS = [
    ("post", "/api/v1/jobs/{id}/pause", {"reason": "x"}),
    ("post", "/api/v1/jobs/{id}/resume", {"reason": "x"}),
    ("post", "/api/v1/jobs/{id}/terminate", {"reason": "x"}),
    ("post", "/api/v1/alerts/{id}/acknowledge", {}),
    ("post", "/api/v1/escalations/{id}/approve", {}),
    ("post", "/api/v1/nodes/{id}/resume", {"reason": "x"}),
    ("put", "/api/v1/teams/{id}/notification-policy", {"ack_timeout_seconds": 60}),
    ("delete", "/api/v1/tokens/{id}", None),
]


@pytest.mark.django_db
@pytest.mark.parametrize("big", HUGE)
def test_huge_ids_in_paths_are_404s(scene, big):
    api = scene.api("admin")
    for template in GETS:
        response = send(api, "get", template.format(id=big))
        assert response.status_code == 404, (template, response.status_code)
        assert response.json()["error"] == "not_found"


@pytest.mark.django_db
@pytest.mark.parametrize("big", [2**63, 10**30])
def test_refused_actions_on_huge_ids_keep_their_audit_row(scene, big):
    api = scene.api("admin")
    for method, template, body in POSTS:
        before = AuditEntry.objects.count()
        response = send(api, method, template.format(id=big), body)
        assert response.status_code == 404, (template, response.status_code, response.content)
        if "tokens" not in template:
            assert AuditEntry.objects.count() == before + 1, template
            row = AuditEntry.objects.order_by("-id").first()
            assert row.outcome_code == "not_found" and str(big) in row.outcome


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["²", "٣", "1e3", "-1", "0", "99999999999999999999", "\x00"])
def test_odd_numbers_in_query_strings_are_400s(scene, value):
    """Each odd number alone makes the request a 400 naming its parameter (the series gets a
    valid metric name, so only the number can be what is refused)."""
    api = scene.api("admin")
    series = f"/api/v1/jobs/{scene.job_id}/series"
    cases = [
        ("/api/v1/alerts", "limit", {}),
        ("/api/v1/alerts", "job", {}),
        ("/api/v1/escalations", "limit", {}),
        ("/api/v1/escalations", "job", {}),
        ("/api/v1/audit", "limit", {}),
        ("/api/v1/audit", "team", {}),
        (series, "max_points", {"names": "loss"}),
    ]
    for path, name, others in cases:
        response = send(api, "get", path, **others, **{name: value})
        assert response.status_code == 400, (path, name, response.status_code)
        assert name in response.json()["fields"], (path, name, response.json())


@pytest.mark.django_db
def test_nul_characters_in_queries_and_bodies_are_400s(scene):
    api = scene.api("viewer")
    assert send(api, "get", "/api/v1/alerts", status="fir\x00ing").status_code == 400
    assert send(api, "get", "/api/v1/escalations", status="\x00").status_code == 400
    series = f"/api/v1/jobs/{scene.job_id}/series"
    assert send(api, "get", series, names="lo\x00ss").status_code == 400
    before = AuditEntry.objects.count()
    response = send(api, "post", f"/api/v1/jobs/{scene.job_id}/pause", {"reason": "a\x00b"})
    assert response.status_code == 400, response.content
    assert "reason" in response.json()["fields"]
    response = send(
        scene.api("admin"), "put", f"/api/v1/teams/{scene.team.pk}/shifts", {"user": "x\x00"}
    )
    assert response.status_code in (400, 405)
    assert AuditEntry.objects.count() >= before


@pytest.mark.django_db
def test_an_api_path_that_matches_no_route_is_a_json_404(scene):
    api = scene.api("viewer")
    for path in ["/api/v1/nothing-here", "/api/v1/jobs/abc", "/api/v2/jobs", "/api/"]:
        response = send(api, "get", path)
        assert response.status_code == 404, path
        assert response["Content-Type"].startswith("application/json"), path
        assert response.json()["error"] == "not_found"
