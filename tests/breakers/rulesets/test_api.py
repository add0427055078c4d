"""The rules API: members read the rule set and its versions, admins change it; hostile input
is a 400 naming the field, with nothing written."""

from __future__ import annotations

import json

import pytest

from breakers.models import Rule, RuleSetVersion
from incidents.models import AuditEntry
from tests.breakers.rulesets.conftest import disable

pytestmark = pytest.mark.django_db


def rules_url(crew, tail=""):
    return f"/api/v1/teams/{crew.team.pk}/rules{tail}"


def test_an_admin_changes_the_rules_and_reads_the_versions(crew):
    api = crew.api("admin")
    before = api.get(rules_url(crew))
    assert before.status_code == 200
    assert before.json()["version"]["number"] == 1
    assert before.json()["drill"]["drilled"] is False  # no drill results: never drilled

    changed = api.post(rules_url(crew), {"why": "too noisy", "changes": disable()})
    assert changed.status_code == 201, changed.content
    body = changed.json()
    assert body["version"]["number"] == 2 and body["version"]["actor"] == api.user.username
    assert body["version"]["snapshot"]["rules"]["loss-deviation"]["enabled"] is False
    assert body["drill"]["since"].startswith("v2: loss-deviation changed (")
    # The badge's link: the team's drills page with the missing scenarios ticked.
    assert body["drill"]["url"].startswith(f"/teams/{crew.team.pk}/drills/?scenario=")
    assert "scenario=nan_loss" in body["drill"]["url"]

    listed = crew.api("viewer").get(rules_url(crew, "/versions"))
    assert [v["number"] for v in listed.json()] == [2, 1]
    assert listed.json()[0]["changes"] == [
        "loss-deviation: enabled True → False; origin default → override"
    ]
    one = crew.api("viewer").get(rules_url(crew, "/versions/1"))
    assert one.status_code == 200 and "loss-deviation" in one.json()["snapshot"]["rules"]
    assert crew.api("viewer").get(rules_url(crew, "/versions/9")).status_code == 404
    assert crew.api("viewer").get(rules_url(crew, "/versions"), limit="0").status_code == 400


@pytest.mark.parametrize("role", ["viewer", "oncall", "manager"])
def test_below_admin_the_change_is_refused_and_audited(crew, role):
    response = crew.api(role).post(rules_url(crew), {"why": "mine", "changes": disable()})
    assert response.status_code == 403
    assert "Only an admin may" in response.json()["detail"]
    assert not Rule.objects.filter(team=crew.team).exists()
    assert AuditEntry.objects.filter(action="edit_rules", allowed=False).count() == 1


def test_another_teams_rules_are_not_found(crew):
    stranger = crew.api(None)  # an admin, of another team
    assert stranger.get(rules_url(crew)).status_code == 404
    refused = stranger.post(rules_url(crew), {"why": "mine", "changes": disable()})
    assert refused.status_code == 404 and not Rule.objects.filter(team=crew.team).exists()
    assert stranger.post(rules_url(crew), {"force": True}).status_code == 404


SPIKE = {
    "name": "x",
    "layer": "stability",
    "metric": "grad_norm",
    "detector": "threshold",
    "params": {"above": 1.0},
}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"changes": disable()}, "why"),
        ({"why": 5, "changes": disable()}, "why"),
        ({"why": "x" * 2001, "changes": disable()}, "why"),
        ({"why": "ok"}, "changes"),
        ({"why": "ok", "changes": "all"}, "changes"),
        ({"why": "ok", "changes": disable(), "force": True}, "force"),
        ({"why": "ok", "changes": [{"op": "disable", "key": "../etc"}]}, "changes[0].key"),
        (
            {
                "why": "ok",
                "changes": [
                    {"op": "update", "key": "loss-rising", "fields": {"params": {"windows": -1}}}
                ],
            },
            "changes[0].fields.params",
        ),
        (
            {
                "why": "ok",
                "changes": [{"op": "update", "key": "loss-rising", "fields": {"severity": "L9"}}],
            },
            "changes[0].fields.severity",
        ),
        (
            {
                "why": "ok",
                "changes": [
                    {"op": "update", "key": "loss-rising", "fields": {"clear_after": "1e9"}}
                ],
            },
            "changes[0].fields.clear_after",
        ),
        (
            {
                "why": "ok",
                "changes": [
                    {"op": "create", "key": "spike", "fields": SPIKE},
                    {"op": "create", "key": "spike2", "fields": {**SPIKE, "detector": "nope"}},
                ],
            },
            "changes[1].fields.detector",
        ),
        ({"why": "ok", "changes": [{"op": "delete", "key": "loss-rising"}]}, "changes[0].key"),
        (
            {"why": "ok", "changes": [{"op": "update", "key": "ghost", "fields": {"name": "b"}}]},
            "changes[0].key",
        ),
        ({"why": "ok\x00", "changes": disable()}, "why"),
    ],
)
def test_hostile_bodies_are_a_400_naming_the_field_and_write_nothing(crew, body, field):
    response = crew.api("admin").post(rules_url(crew), body)
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"], response.json()
    assert not Rule.objects.filter(team=crew.team).exists()
    assert RuleSetVersion.objects.filter(team=crew.team).count() <= 1


@pytest.mark.parametrize(
    "raw",
    [
        '{"why": "x", "changes": [{"op": "update", "key": "loss-rising", "fields": '
        '{"params": {"window": NaN}}}]}',
        "[1, 2]",
        "not json",
        '"a string"',
    ],
)
def test_malformed_json_is_a_400(crew, raw):
    api = crew.api("admin")
    response = api.client.post(
        rules_url(crew), raw, content_type="application/json", headers=api.headers
    )
    assert response.status_code == 400, response.content
    assert json.loads(response.content)["error"]
    assert not Rule.objects.filter(team=crew.team).exists()


def test_the_schema_documents_the_rules_endpoints(client):
    schema = client.get("/api/schema/?format=json").json()
    assert {
        "/api/v1/teams/{id}/rules",
        "/api/v1/teams/{id}/rules/versions",
        "/api/v1/teams/{id}/rules/versions/{number}",
    } <= set(schema["paths"])
