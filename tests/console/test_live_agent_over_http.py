"""The agent protocol against the real stack: Daphne, PostgreSQL, over real HTTP."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import pytest

from breakers.storage.points import stored_points

pytestmark = pytest.mark.django_db(transaction=True)


def post(url: str, token: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_batch_goes_through_daphne_into_postgresql_with_copy(live_console, agent):
    points = [{"name": "loss", "step": s, "value": 1.0 / (s + 1)} for s in range(1000)]
    points.append({"name": "loss", "step": 1000, "value": "NaN"})
    status, body = post(
        f"{live_console}/api/v1/agent/metrics", agent.token, json.dumps({"points": points}).encode()
    )
    assert (status, body) == (202, {"accepted": 1001, "commands": []})
    stored = sorted(stored_points(agent.job_id), key=lambda p: p.step)
    assert len(stored) == 1001
    assert stored[0].value == 1.0 and math.isnan(stored[-1].value)


def test_an_oversized_body_is_413_through_daphne(live_console, agent):
    body = json.dumps(
        {"points": [{"name": "x" * 190, "step": s, "value": 1.0} for s in range(25_000)]}
    ).encode()
    assert len(body) > 4 * 1024 * 1024
    status, error = post(f"{live_console}/api/v1/agent/metrics", agent.token, body)
    assert status == 413 and error["error"] == "payload_too_large"
    assert not stored_points(agent.job_id)
