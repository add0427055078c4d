"""Metric points carry the rank that measured them; the series API draws one rank's line, the
min/max across ranks, more ranks on request; long runs are read from the rollups (a spike
kept), zooms from raw points, and raw points gone past the window still chart from rollups."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.storage import retention, rollups
from breakers.storage.points import StoredPoint, stored_points
from incidents.models import Job
from tests.console.test_series_api import get_series
from tests.console.test_series_api import viewer as viewer_fixture

viewer = viewer_fixture  # the same signed-in viewer of team vision's job

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 4, 1, 8, 0, 0, tzinfo=UTC)


def every_point() -> list[StoredPoint]:
    """Every stored point of every job (raw rows and blocks alike)."""
    return [p for job_id in Job.objects.values_list("pk", flat=True) for p in stored_points(job_id)]


def value(step: int, rank: int) -> float:
    return 2.0 + math.sin(step / 40.0) * 0.1 + rank * 0.01


def test_a_batch_names_its_rank_and_a_point_may_name_its_own(agent, agent_post):
    point = {"name": "loss", "step": 1, "value": 2.0}
    body = {"rank": 3, "points": [point, {**point, "value": 2.5, "rank": 5}]}
    assert agent_post("/api/v1/agent/metrics", body).status_code == 202
    plain = {"points": [{**point, "step": 2, "value": 1.0}]}
    assert agent_post("/api/v1/agent/metrics", plain).status_code == 202
    ranks = [(p.step, p.rank) for p in sorted(every_point(), key=lambda p: (p.step, p.value))]
    assert ranks == [(1, 3), (1, 5), (2, 0)]  # no rank at all: rank 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"rank": -1, "points": []}, "rank"),
        ({"rank": "0", "points": []}, "rank"),
        ({"points": [{"name": "loss", "step": 1, "value": 1.0, "rank": True}]}, "points[0].rank"),
        ({"points": [{"name": "loss", "step": 1, "value": 1.0, "rank": 2**31}]}, "points[0].rank"),
    ],
)
def test_a_bad_rank_is_refused_naming_the_field_and_nothing_is_stored(agent_post, body, field):
    response = agent_post("/api/v1/agent/metrics", body)
    assert response.status_code == 400
    assert field in response.json()["fields"]
    assert not every_point()


def test_rank_zero_line_with_the_min_max_of_every_rank_and_a_nan_of_another_rank(client, viewer):
    Job.objects.filter(pk=viewer.job_id).update(world_size=3)
    points = [PointIn("loss", s, value(s, r), None, None, r) for s in range(300) for r in range(3)]
    points.append(PointIn("loss", 150, 9.0, None, None, 1))  # rank 1's spike at step 150
    points.append(PointIn("loss", 200, float("nan"), None, None, 2))
    store_points(viewer.job_id, points)
    loss = get_series(client, viewer.job_id, names="loss")["loss"]
    assert loss["rank"] == 0 and loss["source"] == "raw" and loss["steps"] == list(range(300))
    assert loss["values"] == pytest.approx([value(s, 0) for s in range(300)])
    spread = loss["spread"]
    assert spread["steps"] == list(range(300))
    assert spread["low"] == pytest.approx([value(s, 0) for s in range(300)])
    high = [9.0 if s == 150 else value(s, 2) for s in range(300)]
    assert spread["high"] == pytest.approx(high)
    assert (spread["marker_steps"], spread["marker_values"]) == ([200], ["NaN"])
    one = get_series(client, viewer.job_id, names="loss", rank=1, ranks="0,2", spread=0)["loss"]
    assert one["rank"] == 1 and one["spread"] is None
    assert dict(zip(one["steps"], one["values"], strict=True))[150] == 9.0
    two = one["ranks"]["2"]
    assert set(one["ranks"]) == {"0", "2"} and (200, "NaN") in zip(
        two["steps"], two["values"], strict=True
    )


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"ranks": "1,x"}, "ranks"),
        ({"ranks": ",".join(map(str, range(17)))}, "ranks"),
        ({"rank": "-2"}, "rank"),
        ({"rank": str(2**31)}, "rank"),
        ({"spread": "yes"}, "spread"),
    ],
)
def test_bad_rank_parameters_are_a_400_naming_them(client, viewer, params, field):
    response = client.get(f"/api/v1/jobs/{viewer.job_id}/series", {"names": "loss", **params})
    assert response.status_code == 400 and field in response.json()["fields"]


def long_run(job_id: int, steps: int, ranks: int) -> None:
    """One step a second, ``ranks`` ranks; rank 1 spikes once at step 4,321."""
    points = [
        PointIn(
            "loss",
            s,
            9.0 if (s, r) == (4321, 1) else value(s, r),
            T0 + timedelta(seconds=s),
            None,
            r,
        )
        for s in range(steps)
        for r in range(ranks)
    ]
    store_points(job_id, points)


def test_the_full_run_comes_from_the_rollups_a_zoom_from_raw_points(client, viewer, settings):
    settings.METRIC_RAW_RETENTION_SECONDS = 3600
    long_run(viewer.job_id, 12_000, ranks=2)
    rollups.roll_up_job(viewer.job_id)
    # Points stored after the last roll-up are read from the raw table with the rollups.
    store_points(
        viewer.job_id, [PointIn("loss", 12_000, -7.0, T0 + timedelta(seconds=12_000), None)]
    )
    whole = get_series(client, viewer.job_id, names="loss", max_points=200, spread=1)["loss"]
    assert whole["source"] == "rollups-60s" and whole["bucket_steps"] == 121
    assert whole["steps"][-1] == 12_000 and whole["values"][-1] == -7.0
    assert max(whole["spread"]["high"]) == 9.0  # rank 1's one-second spike is not averaged away
    assert whole["steps"] == sorted(whole["steps"])
    zoom = get_series(client, viewer.job_id, names="loss", from_step=5000, to_step=5099)["loss"]
    assert zoom["source"] == "raw" and zoom["steps"] == list(range(5000, 5100))
    # Three days on every raw point is past the one-hour window; the whole run still charts.
    with time_machine.travel(T0 + timedelta(seconds=12_000 + 3 * 24 * 3600), tick=False):
        rollups.roll_up_job(viewer.job_id)
        retention.prune()
    assert len(stored_points(viewer.job_id)) == 0
    after = get_series(client, viewer.job_id, names="loss", max_points=200, spread=1)["loss"]
    assert after["source"] == "rollups-60s" and max(after["spread"]["high"]) == 9.0
    assert after["steps"][0] < 121 and after["steps"][-1] == 12_000  # the first bucket, the last
    old = get_series(client, viewer.job_id, names="loss", from_step=4300, to_step=4340, rank=1)
    assert old["loss"]["source"] == "rollups-10s"  # no raw points left: the finest rollups
    assert 9.0 in old["loss"]["values"]
