"""Finding 4: a viewer's POST of follow_up_count=10000000 to the review page burned seconds of
CPU before the 403, and "abc" was a 500. Now the permission comes first and every count is
bounded. Finding 5 (part): review endpoints accept personal tokens, 401 when nobody is known."""

from __future__ import annotations

import json
import time

import pytest
from django.test import Client

from incidents.models import AuditEntry, PersonalToken


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_a_viewer_with_a_huge_count_is_refused_at_once_and_audited(flow):
    client = logged_in(flow.team.person("viewer"))
    started = time.monotonic()
    response = client.post(
        f"/incidents/{flow.incident_id}/review/",
        {"revision": "0", "follow_up_count": "10000000000000000000"},
    )
    assert response.status_code == 403
    assert time.monotonic() - started < 1.0
    assert AuditEntry.objects.filter(action="edit_review", allowed=False).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("count", ["abc", "-1", "10000000", "1e9", "٣", "99999999999999999999999"])
def test_an_editor_with_a_bad_count_gets_a_400_not_a_500(flow, count):
    client = logged_in(flow.team.person("oncall"))
    started = time.monotonic()
    response = client.post(
        f"/incidents/{flow.incident_id}/review/", {"revision": "0", "follow_up_count": count}
    )
    assert response.status_code == 400, response.content[:300]
    assert "follow_up_count" in response.content.decode()
    assert time.monotonic() - started < 2.0


@pytest.mark.django_db
@pytest.mark.parametrize("revision", ["abc", "99999999999999999999", "-3"])
def test_a_bad_revision_on_the_form_is_a_400(flow, revision):
    client = logged_in(flow.team.person("oncall"))
    response = client.post(f"/incidents/{flow.incident_id}/review/", {"revision": revision})
    assert response.status_code == 400


@pytest.mark.django_db
def test_the_review_api_takes_personal_tokens_and_401s_strangers(flow):
    oncall, viewer = flow.team.person("oncall"), flow.team.person("viewer")
    token = PersonalToken.issue(oncall, "script")[1]
    headers = {"Authorization": f"Token {token}"}
    base = f"/api/v1/incidents/{flow.incident_id}"
    client = Client()
    for path in (
        f"{base}/review",
        f"{base}/review.json",
        f"{base}/review.md",
        f"/api/v1/teams/{flow.team.team.pk}/incident-report",
    ):
        assert client.get(path, headers=headers).status_code == 200, path
        assert client.get(path).status_code == 401, path
    document = client.get(f"{base}/review", headers=headers).json()
    body = {"revision": document["review"]["revision"], "status": "draft", "summary": "by token"}
    response = client.put(
        f"{base}/review", json.dumps(body), content_type="application/json", headers=headers
    )
    assert response.status_code == 200, response.content
    viewer_token = PersonalToken.issue(viewer, "script")[1]
    response = client.put(
        f"{base}/review",
        json.dumps(body),
        content_type="application/json",
        headers={"Authorization": f"Token {viewer_token}"},
    )
    assert response.status_code == 403
    huge = {"revision": 0, "follow_ups": [{"text": "x"}] * 100_000}
    response = client.put(
        f"{base}/review",
        json.dumps(huge),
        content_type="application/json",
        headers={"Authorization": f"Token {viewer_token}"},
    )
    assert response.status_code == 403
