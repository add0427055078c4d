"""GET /api/v1/jobs/<id>/series and /markers: min/max downsampling in SQL, NaN kept, the band."""

from __future__ import annotations

import math
import statistics

import pytest
from django.contrib.auth import get_user_model

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.control.commands import issue_command
from breakers.detection.rules import install_default_pack
from breakers.metrics import metric_groups
from incidents.models import Membership, Role, Team

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client, make_agent):
    job = make_agent(team="vision", name="vit")
    user = get_user_model().objects.create_user("ana", password="pw")
    Membership.objects.create(user=user, team=Team.objects.get(name="vision"), role=Role.VIEWER)
    client.force_login(user)
    return job


def wave(step: int) -> float:
    return 3.0 + math.sin(step / 50.0) * 0.1 + (step % 7) * 0.001


def get_series(client, job_id: int, **params) -> dict:
    response = client.get(f"/api/v1/jobs/{job_id}/series", params)
    assert response.status_code == 200, response.content
    return response.json()["series"]


def test_a_long_series_is_downsampled_but_keeps_its_spike_and_its_nan(client, viewer):
    points = [PointIn("loss", s, wave(s), None, None) for s in range(10_000)]
    points[7_777] = PointIn("loss", 7_777, 50.0, None, None)  # one-step spike
    points[4_512] = PointIn("loss", 4_512, float("nan"), None, None)
    points[9_000] = PointIn("loss", 9_000, float("-inf"), None, None)
    store_points(viewer.job_id, points)
    loss = get_series(client, viewer.job_id, names="loss", max_points=200)["loss"]
    assert loss["bucket_steps"] == 100
    assert 190 <= len(loss["steps"]) <= 202  # two per bucket, plus the two markers
    assert loss["steps"] == sorted(loss["steps"])
    by_step = dict(zip(loss["steps"], loss["values"], strict=True))
    assert by_step[7_777] == 50.0 and by_step[4_512] == "NaN" and by_step[9_000] == "-Infinity"
    finite = [v for v in loss["values"] if isinstance(v, float)]
    assert min(finite) == min(p.value for p in points if math.isfinite(p.value))
    assert len(loss["times"]) == len(loss["steps"])


def test_zooming_in_returns_the_raw_points_of_the_range(client, viewer):
    store_points(viewer.job_id, [PointIn("loss", s, wave(s), None, None) for s in range(5_000)])
    loss = get_series(client, viewer.job_id, names="loss", from_step=1000, to_step=1499)["loss"]
    assert loss["bucket_steps"] == 1
    assert loss["steps"] == list(range(1000, 1500))
    assert loss["values"] == pytest.approx([wave(s) for s in range(1000, 1500)])
    tail = get_series(client, viewer.job_id, names="loss", from_step=4_990)["loss"]
    assert tail["steps"] == list(range(4_990, 5_000))


def test_the_band_is_the_rules_mean_plus_minus_k_sigma_of_the_window(client, viewer):
    install_default_pack()  # loss-deviation: k = 2, window = 200 points
    values = [wave(s) + ((s * 7919) % 13) * 0.01 for s in range(600)]
    store_points(viewer.job_id, [PointIn("loss", s, v, None, None) for s, v in enumerate(values)])
    loss = get_series(client, viewer.job_id, names="loss", from_step=300, max_points=2000)["loss"]
    band = loss["band"]
    assert (band["rule"], band["k"], band["window"]) == ("loss-deviation", 2.0, 200)
    for i, step in enumerate(loss["steps"]):
        window = values[step - 200 : step]  # the baseline a point is judged against
        mean, sigma = statistics.fmean(window), statistics.pstdev(window)
        assert band["lower"][i] == pytest.approx(mean - 2 * sigma, rel=1e-9)
        assert band["upper"][i] == pytest.approx(mean + 2 * sigma, rel=1e-9)
    warm = get_series(client, viewer.job_id, names="loss", to_step=250)["loss"]["band"]
    assert warm["upper"][:200] == [None] * 200 and warm["upper"][200] is not None


def test_several_names_bad_parameters_and_other_teams(client, viewer, make_agent):
    store_points(viewer.job_id, [PointIn("grad_norm", 1, 0.5, None, None)])
    both = get_series(client, viewer.job_id, names="loss,grad_norm")
    assert both["loss"]["steps"] == [] and both["grad_norm"]["values"] == [0.5]
    assert both["grad_norm"]["band"] is None
    for bad in [{}, {"names": "loss", "max_points": "x"}, {"names": "loss", "max_points": 10**6}]:
        response = client.get(f"/api/v1/jobs/{viewer.job_id}/series", bad)
        assert response.status_code == 400 and response.json()["error"] == "invalid"
    other = make_agent(team="secret", name="hidden")
    assert client.get(f"/api/v1/jobs/{other.job_id}/series", {"names": "loss"}).status_code == 404
    assert client.get(f"/api/v1/jobs/{other.job_id}/markers").status_code == 404


def test_markers_put_commands_and_alerts_at_their_steps(client, viewer):
    install_default_pack()
    store_points(viewer.job_id, [PointIn("loss", s, 2.0, None, None) for s in range(50)])
    issue_command(viewer.job_id, "lower_lr", reason="test", params={"factor": 0.5})
    marks = client.get(f"/api/v1/jobs/{viewer.job_id}/markers").json()
    assert marks["alerts"] == []
    assert [(c["kind"], c["step"], c["label"]) for c in marks["commands"]] == [
        ("lower_lr", 49, "LR ×0.5")
    ]


def test_metrics_are_grouped_one_chart_per_kind():
    groups = metric_groups(
        [
            "gpu.0.util",
            "gpu.1.util",
            "gpu.0.temp",
            "grad_norm",
            "loss",
            "lr",
            "val_loss",
            "throughput",
            "node.3.failure",
            "custom",
        ]
    )
    assert [(g["key"], g["names"]) for g in groups] == [
        ("loss", ["loss", "val_loss"]),
        ("grad", ["grad_norm"]),
        ("lr", ["lr"]),
        ("throughput", ["throughput"]),
        ("health", ["node.3.failure"]),
        ("gpu-temp", ["gpu.0.temp"]),
        ("gpu-util", ["gpu.0.util", "gpu.1.util"]),
        ("metric-custom", ["custom"]),
    ]
