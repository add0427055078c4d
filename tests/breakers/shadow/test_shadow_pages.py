"""The rules page and the API show what a shadow rule would have done against the real
incidents, and promote it to live. A scripted scene on a travelled clock: the shadow rule
watches a bad-batch counter; on job A it fires 25 s (2 steps) before the NaN the live rule
brakes; on job B it fires with no incident at all."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.test import Client

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.detection import rulesets
from breakers.detection.evaluation import evaluate_job
from breakers.detection.rules import install_default_pack
from incidents.jobs import create_job
from tests.support.authz import make_scene

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
RULE = {
    "name": "Bad batches seen by the loader",
    "layer": "stability",
    "metric": "data.bad_batches",
    "detector": "threshold",
    "params": {"above": 0.0},
    "severity": "L3",
    "action": "checkpoint_and_pause",
    "shadow": True,
}


def at(seconds: float):
    return time_machine.travel(T0 + timedelta(seconds=seconds), tick=False)


def loss(steps: range) -> list[PointIn]:
    return [PointIn("loss", s, 2.0 + (s % 7) * 0.01, None, None) for s in steps]


@pytest.fixture
def scene():
    install_default_pack()
    with at(-3600):
        scene = make_scene()
        rulesets.change_rules(
            scene.person("admin"),
            scene.team.pk,
            "watch the loader",
            [{"op": "create", "key": "bad-batches", "fields": RULE}],
        )
        other = create_job(scene.team.name, "job-b").job.pk
    with at(0):
        store_points(
            scene.job_id, [*loss(range(58)), PointIn("data.bad_batches", 58, 1.0, None, None)]
        )
        store_points(other, [*loss(range(30)), PointIn("data.bad_batches", 30, 2.0, None, None)])
        evaluate_job(scene.job_id)
        evaluate_job(other)
    with at(20):
        store_points(scene.job_id, [PointIn("loss", 60, float("nan"), None, None)])
    with at(25):
        evaluate_job(scene.job_id)  # the live NaN rule raises its L3 now
    return scene


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_rules_page_compares_the_shadow_rule_with_the_real_incidents(scene):
    with at(3600):
        page = browser(scene.person("viewer")).get(f"/teams/{scene.team.pk}/rules/")
    text = page.content.decode()
    row = text[text.index('data-shadow-rule="bad-batches"') :].split("</tr>")[0]
    assert 'data-label="fired">2<' in row and 'data-label="jobs">2<' in row
    assert 'data-label="inside">1<' in row and 'data-label="outside">1<' in row
    assert 'data-label="caught">1 of 1<' in row
    assert 'data-label="lead">-25 s · -2 steps<' in row
    assert "job-b: 1" in row
    assert "Promote to live" not in row  # a viewer reads, an admin promotes


def test_the_api_gives_the_same_figures(scene):
    client = browser(scene.person("viewer"))
    with at(3600):
        answer = client.get(f"/api/v1/teams/{scene.team.pk}/rules/shadow")
    (line,) = answer.json()["rules"]
    assert (line["key"], line["fired"], line["inside_incidents"], line["caught"]) == (
        "bad-batches",
        2,
        1,
        1,
    )
    assert (line["median_lead_seconds"], line["median_lead_steps"]) == (-25.0, -2.0)
    refused = client.get(f"/api/v1/teams/{scene.team.pk}/rules/shadow?since=soon")
    assert refused.status_code == 400 and "since" in refused.json()["fields"]
    refused = client.get(f"/api/v1/teams/{scene.team.pk}/rules/shadow?rule=x")
    assert refused.status_code == 400 and "rule" in refused.json()["fields"]


def test_an_admin_promotes_it_on_the_page_and_the_api_refuses_the_rest(scene):
    url = f"/api/v1/teams/{scene.team.pk}/rules/bad-batches/promote"
    viewer = browser(scene.person("viewer"))
    assert viewer.post(url, {"why": "go"}, content_type="application/json").status_code == 403
    admin = browser(scene.person("admin"))
    odd = admin.post(url, {"why": "go", "force": True}, content_type="application/json")
    assert odd.status_code == 400 and "force" in odd.json()["fields"]
    with at(3600):
        page = admin.get(f"/teams/{scene.team.pk}/rules/")
        assert "Promote to live" in page.content.decode()
        admin.post(
            f"/teams/{scene.team.pk}/rules/",
            {"op": "promote", "key": "bad-batches", "why": "caught the NaN 25 s early"},
        )
    version = scene.team.ruleset_versions.order_by("-number").first()
    assert version.why == "caught the NaN 25 s early" and version.actor == scene.person("admin")
    assert admin.post(url, {"why": "again"}, content_type="application/json").status_code == 409
    no_rule = f"/api/v1/teams/{scene.team.pk}/rules/no-such-rule/promote"
    answer = admin.post(no_rule, {"why": "x"}, content_type="application/json")
    assert answer.status_code == 400 and "changes[0].key" in answer.json()["fields"]
