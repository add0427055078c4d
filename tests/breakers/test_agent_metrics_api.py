"""POST /api/v1/agent/metrics: what is accepted, and every way a batch is refused whole."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from breakers.storage.points import any_points_stored, stored_points
from console.ratelimit import rate_counter
from incidents.agent_tokens import revoke_agent_tokens
from incidents.models import Job, JobStatus, Node

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

URL = "/api/v1/agent/metrics"
pytestmark = pytest.mark.django_db


def point(**overrides):
    base = {"name": "loss", "step": 1, "value": 2.5}
    base.update(overrides)
    return base


def recent(seconds_ago: float = 60.0) -> datetime:
    """A time inside the accepted window (built from now: no test depends on today's date)."""
    return (datetime.now(tz=UTC) - timedelta(seconds=seconds_ago)).replace(microsecond=0)


def test_a_batch_is_stored_with_its_fields_and_answers_202(agent, agent_post):
    sent_at = recent()
    response = agent_post(
        URL,
        {
            "points": [
                point(step=1, value=2.5, time=sent_at.isoformat(), node="node-07"),
                point(name="grad_norm", step=1, value=3),
            ]
        },
    )
    assert response.status_code == 202, response.content
    assert response.json() == {"accepted": 2, "commands": []}
    stored = {p.name: p for p in stored_points(agent.job_id)}
    assert stored["loss"].value == 2.5 and stored["loss"].node == "node-07"
    assert stored["loss"].time == sent_at
    assert stored["grad_norm"].value == 3.0 and stored["grad_norm"].node is None
    job = Job.objects.get(pk=agent.job_id)
    assert job.status == JobStatus.RUNNING and job.current_step == 1
    assert job.last_metric_at is not None
    assert list(Node.objects.filter(job=job).values_list("hostname", flat=True)) == ["node-07"]


@pytest.mark.parametrize(
    "sent, check",
    [
        ('"NaN"', math.isnan),
        ('"Infinity"', lambda v: v == math.inf),
        ('"-Infinity"', lambda v: v == -math.inf),
        ("NaN", math.isnan),
        ("Infinity", lambda v: v == math.inf),
        ("-Infinity", lambda v: v == -math.inf),
    ],
)
def test_non_finite_values_are_data_and_stored_as_such(agent, agent_post, sent, check):
    body = '{"points": [{"name": "loss", "step": 7, "value": ' + sent + "}]}"
    response = agent_post(URL, body)
    assert response.status_code == 202, response.content
    (stored,) = stored_points(agent.job_id)
    assert stored.value is not None and check(stored.value)


def test_current_step_never_moves_backwards(agent, agent_post):
    agent_post(URL, {"points": [point(step=50)]})
    agent_post(URL, {"points": [point(step=10)]})
    assert Job.objects.get(pk=agent.job_id).current_step == 50


def test_an_empty_batch_is_accepted(agent, agent_post):
    response = agent_post(URL, {"points": []})
    assert response.status_code == 202 and response.json()["accepted"] == 0


_NOW = datetime.now(tz=UTC).isoformat()
_TWO_DAYS_AGO = (datetime.now(tz=UTC) - timedelta(days=2)).isoformat()
BAD_BODIES = [
    # (body, expected error code, field that must be named or None)
    (b"{not json", "malformed_json", None),
    (b"", "malformed_json", None),
    (b"[1, 2]", "malformed_json", None),
    (b'"points"', "malformed_json", None),
    ({}, "invalid", "points"),
    ({"points": {"name": "loss"}}, "invalid", "points"),
    ({"points": [], "extra": 1}, "invalid", "extra"),
    ({"points": [5]}, "invalid", "points[0]"),
    ({"points": [{"step": 1, "value": 1.0}]}, "invalid", "points[0].name"),
    ({"points": [{"name": "loss", "value": 1.0}]}, "invalid", "points[0].step"),
    ({"points": [{"name": "loss", "step": 1}]}, "invalid", "points[0].value"),
    ({"points": [point(name="")]}, "invalid", "points[0].name"),
    ({"points": [point(name="   ")]}, "invalid", "points[0].name"),
    ({"points": [point(name="x" * 201)]}, "invalid", "points[0].name"),
    ({"points": [point(name=7)]}, "invalid", "points[0].name"),
    ({"points": [point(step=-1)]}, "invalid", "points[0].step"),
    ({"points": [point(step=1.5)]}, "invalid", "points[0].step"),
    ({"points": [point(step=2.0)]}, "invalid", "points[0].step"),
    ({"points": [point(step="3")]}, "invalid", "points[0].step"),
    ({"points": [point(step=True)]}, "invalid", "points[0].step"),
    ({"points": [point(step=2**63)]}, "invalid", "points[0].step"),
    ({"points": [point(value="2.5")]}, "invalid", "points[0].value"),
    ({"points": [point(value="nan")]}, "invalid", "points[0].value"),
    ({"points": [point(value=None)]}, "invalid", "points[0].value"),
    ({"points": [point(value=True)]}, "invalid", "points[0].value"),
    ({"points": [point(time="yesterday")]}, "invalid", "points[0].time"),
    ({"points": [point(time="2026-01-01T00:00:00")]}, "invalid", "points[0].time"),
    ({"points": [point(time=1700000000)]}, "invalid", "points[0].time"),
    ({"points": [point(node="")]}, "invalid", "points[0].node"),
    ({"points": [point(node=["a"])]}, "invalid", "points[0].node"),
    ({"points": [point(colour="red")]}, "invalid", "points[0].colour"),
    # A metric name may hold brackets, a node name may not: a node named like an earlier
    # metric of the batch is still checked as a node.
    ({"points": [point(name="gpu[1-4]"), point(node="gpu[1-4]")]}, "invalid", "points[1].node"),
    # Times are parsed once per distinct text: the second copy of a good time is good, a
    # different time outside the window is still refused.
    (
        {"points": [point(time=_NOW), point(time=_NOW), point(time=_TWO_DAYS_AGO)]},
        "invalid",
        "points[2].time",
    ),
]


@pytest.mark.parametrize("body, code, field", BAD_BODIES)
def test_bad_input_is_refused_with_a_clear_error_and_nothing_written(
    agent, agent_post, body, code, field
):
    response = agent_post(URL, body)
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["error"] == code
    assert error["detail"] and isinstance(error["fields"], dict)
    if field is not None:
        assert field in error["fields"], error
    assert not stored_points(agent.job_id)
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.PENDING


def test_one_bad_point_refuses_the_whole_batch(agent, agent_post):
    points = [point(step=i) for i in range(500)] + [point(step=-3)]
    response = agent_post(URL, {"points": points})
    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["points[500].step"]
    assert len(stored_points(agent.job_id)) == 0


def test_many_bad_points_are_reported_up_to_a_limit(agent, agent_post):
    response = agent_post(URL, {"points": [point(step=-1)] * 100})
    assert response.status_code == 400
    assert len(response.json()["fields"]) == 20
    assert "only the first ones" in response.json()["detail"]


def test_too_many_points_is_413_and_writes_nothing(agent, agent_post, settings):
    settings.AGENT_MAX_BATCH_POINTS = 10
    response = agent_post(URL, {"points": [point(step=i) for i in range(11)]})
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert "at most 10 points" in response.json()["detail"]
    assert not any_points_stored()


def test_too_many_bytes_is_413_and_writes_nothing(agent, agent_post, settings):
    settings.AGENT_MAX_BATCH_BYTES = 1000
    response = agent_post(URL, {"points": [point(step=i, name="m" * 150) for i in range(10)]})
    assert response.status_code == 413
    assert response.json()["fields"] == {"body": "at most 1000 bytes"}
    assert not any_points_stored()


def test_exactly_the_limit_is_accepted(agent, agent_post, settings):
    settings.AGENT_MAX_BATCH_POINTS = 10
    response = agent_post(URL, {"points": [point(step=i) for i in range(10)]})
    assert response.status_code == 202


@pytest.mark.parametrize(
    "headers, code",
    [
        ({}, "missing_token"),
        ({"Authorization": "Token abc"}, "malformed_token"),
        ({"Authorization": "Bearer"}, "malformed_token"),
        ({"Authorization": "Bearer bkl_not-a-real-token"}, "unknown_token"),
    ],
)
def test_missing_malformed_or_unknown_token_is_401(client, agent, headers, code):
    response = client.post(
        URL,
        data='{"points": [{"name": "loss", "step": 1, "value": 1}]}',
        content_type="application/json",
        headers=headers,
    )
    assert response.status_code == 401
    assert response.json()["error"] == code
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert not any_points_stored()


def test_a_revoked_token_is_401(agent, agent_post):
    revoke_agent_tokens(Job.objects.get(pk=agent.job_id))
    response = agent_post(URL, {"points": [point()]})
    assert response.status_code == 401
    assert response.json()["error"] == "revoked_token"
    assert not any_points_stored()


def test_a_token_writes_only_to_its_own_job(make_agent, client):
    first, second = make_agent(name="first"), make_agent(name="second")
    client.post(
        URL, data={"points": [point()]}, content_type="application/json", headers=second.headers
    )
    assert len(stored_points(second.job_id)) == 1
    assert not stored_points(first.job_id)


def test_get_is_405_in_the_error_format(client, agent):
    response = client.get(URL, headers=agent.headers)
    assert response.status_code == 405
    assert response.json()["error"] == "method_not_allowed"


def test_rate_limit_answers_429_with_retry_after(agent, agent_post, settings):
    rates = dict(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"], agent="3/hour")
    settings.REST_FRAMEWORK = dict(settings.REST_FRAMEWORK, DEFAULT_THROTTLE_RATES=rates)
    # Job ids restart with every test database; the counter in Redis outlives it.
    rate_counter().reset(f"agent:{agent.job_id}")
    codes = [agent_post(URL, {"points": [point(step=i)]}).status_code for i in range(4)]
    assert codes == [202, 202, 202, 429]
    refused = agent_post(URL, {"points": [point(step=9)]})
    assert refused.json()["error"] == "rate_limited"
    assert int(refused.headers["Retry-After"]) > 0
    assert len(stored_points(agent.job_id)) == 3
