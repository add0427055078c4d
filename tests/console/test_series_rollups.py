"""The series API beyond the raw window: answered from the rollups, spikes and NaN kept, in the
format the job page's chart already reads; zooming in still gets raw points where they exist."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.detection.rules import install_default_pack
from breakers.history import retention, rollups
from breakers.models import MetricPoint
from incidents.models import Membership, Role, Team

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def viewer(client, make_agent):
    job = make_agent(team="vision", name="vit")
    user = get_user_model().objects.create_user("ana", password="pw")
    Membership.objects.create(user=user, team=Team.objects.get(name="vision"), role=Role.VIEWER)
    client.force_login(user)
    return job


def wave(step: int) -> float:
    return 3.0 + math.sin(step / 50.0) * 0.1


def long_run(job_id: int, steps: int) -> list[PointIn]:
    """One step a second, so 10,000 steps are 167 one-minute and 1,000 ten-second buckets."""
    points = [PointIn("loss", s, wave(s), T0 + timedelta(seconds=s), None) for s in range(steps)]
    points[7_777] = PointIn("loss", 7_777, 50.0, points[7_777].time, None)
    points[2_222] = PointIn("loss", 2_222, -9.0, points[2_222].time, None)
    points[4_512] = PointIn("loss", 4_512, float("nan"), points[4_512].time, None)
    points[9_000] = PointIn("loss", 9_000, float("-inf"), points[9_000].time, None)
    store_points(job_id, points)
    return points


def get_loss(client, job_id: int, **params) -> dict:
    response = client.get(f"/api/v1/jobs/{job_id}/series", {"names": "loss", **params})
    assert response.status_code == 200, response.content
    return response.json()["series"]["loss"]


def test_beyond_the_raw_window_the_rollups_answer_with_the_spike_and_the_nan(client, viewer):
    long_run(viewer.job_id, 10_000)
    rollups.roll_up_all()
    with time_machine.travel(T0 + timedelta(days=30), tick=False):
        retention.prune()
    assert not MetricPoint.objects.filter(job_id=viewer.job_id).exists()
    loss = get_loss(client, viewer.job_id, max_points=200)
    assert set(loss) == {"name", "bucket_steps", "steps", "times", "values", "band"}
    assert loss["bucket_steps"] == 100
    assert loss["steps"] == sorted(loss["steps"]) and len(loss["steps"]) <= 2 * 100 + 2
    assert len(loss["times"]) == len(loss["values"]) == len(loss["steps"])
    by_step = dict(zip(loss["steps"], loss["values"], strict=True))
    assert by_step[7_777] == 50.0 and by_step[2_222] == -9.0
    assert by_step[4_512] == "NaN" and by_step[9_000] == "-Infinity"
    # Times are the rollup bucket's start: within its minute of the point's own time.
    for step, when in zip(loss["steps"], loss["times"], strict=True):
        assert 0 <= (T0 + timedelta(seconds=step)).timestamp() - when < 60
    # A zoom the rollups cannot resolve still answers from them, never with nothing.
    zoom = get_loss(client, viewer.job_id, from_step=7_700, to_step=7_800)
    assert 7_777 in zoom["steps"] and zoom["bucket_steps"] == 1


def test_more_points_than_buckets_asked_read_rollups_and_the_unrolled_tail_raw(client, viewer):
    points = long_run(viewer.job_id, 10_000)
    raw = get_loss(client, viewer.job_id, max_points=200)
    rollups.roll_up_all()
    # Proof of the source: a raw row changed behind the rollups' back is not what is drawn.
    MetricPoint.objects.filter(job_id=viewer.job_id, step=5_000).update(value=999.0)
    store_points(  # the newest points, not merged yet: stitched from the raw table
        viewer.job_id,
        [PointIn("loss", s, 70.0 if s == 10_400 else wave(s), T0 + timedelta(seconds=s), None)
         for s in range(10_000, 10_500)],
    )  # fmt: skip
    rolled = get_loss(client, viewer.job_id, max_points=200)
    assert rolled["bucket_steps"] == 105  # 10,500 steps in 100 buckets
    by_step = dict(zip(rolled["steps"], rolled["values"], strict=True))
    assert by_step[7_777] == 50.0 and by_step[4_512] == "NaN" and by_step[10_400] == 70.0
    assert max(rolled["steps"]) >= 10_400 and 999.0 not in rolled["values"]
    finite = [v for v in rolled["values"] if isinstance(v, float)]
    assert min(finite) == min(p.value for p in points if math.isfinite(p.value))
    assert raw["bucket_steps"] == 100 and by_step[9_000] == "-Infinity"
    # Zoomed into the raw window, the raw points themselves, one per step.
    zoom = get_loss(client, viewer.job_id, from_step=1_000, to_step=1_499)
    assert zoom["steps"] == list(range(1_000, 1_500))
    assert zoom["values"] == pytest.approx([wave(s) for s in range(1_000, 1_500)])


def test_the_loss_band_is_drawn_from_rollups_too(client, viewer):
    install_default_pack()  # loss-deviation: k = 2, window = 200 points
    long_run(viewer.job_id, 10_000)
    raw = get_loss(client, viewer.job_id, max_points=200)["band"]
    rollups.roll_up_all()
    with time_machine.travel(T0 + timedelta(days=30), tick=False):
        retention.prune()
    loss = get_loss(client, viewer.job_id, max_points=200)
    band = loss["band"]
    assert (band["rule"], band["k"], band["window"]) == (raw["rule"], raw["k"], raw["window"])
    assert len(band["lower"]) == len(band["upper"]) == len(loss["steps"])
    drawn = [(lo, up) for lo, up in zip(band["lower"], band["upper"], strict=True) if lo]
    assert len(drawn) > 150 and all(lo < up for lo, up in drawn)


def test_points_after_a_resume_to_an_earlier_step_show_before_they_are_merged(client, viewer):
    long_run(viewer.job_id, 10_000)
    rollups.roll_up_all()
    resumed = [  # resumed from the checkpoint of step 9,000, an hour later: not merged yet
        PointIn("loss", s, 80.0 if s == 9_100 else 1.0, T0 + timedelta(seconds=s + 3600), None)
        for s in range(9_000, 9_500)
    ]
    store_points(viewer.job_id, resumed)
    loss = get_loss(client, viewer.job_id, max_points=200)
    by_step = dict(zip(loss["steps"], loss["values"], strict=True))
    assert by_step[9_100] == 80.0 and by_step[7_777] == 50.0
    assert loss["steps"] == sorted(loss["steps"])
    rollups.roll_up_all()  # merged now: read from the rollups alone, still there, still in order
    merged = get_loss(client, viewer.job_id, max_points=200)
    assert dict(zip(merged["steps"], merged["values"], strict=True))[9_100] == 80.0
    assert merged["steps"] == sorted(merged["steps"])
