"""The review page's curve (console/review_chart.py, pure): numbers a person reads, the healthy
view on the demo's data shape (explosion to ~3.5e33, NaN, pause, resume), labels that never
cover each other."""

from __future__ import annotations

import math
import random

import pytest

from console.review_chart import chart, downsample, format_number, healthy_range


def demo_episode() -> list[tuple[int, float]]:
    """The loss around the demo's incident: a healthy plateau, the explosion of the
    learning-rate bug to ~3.5e33, a NaN at 558, healthy again after the resume."""
    rng = random.Random(7)
    points = []
    for step in range(300, 900):
        if 500 <= step < 558:
            value = 0.03 * 10 ** (35.07 * ((step - 500) / 57) ** 2)
        elif step == 558:
            value = math.nan
        else:
            value = (0.02 + 1.1 * math.exp(-step / 80)) * rng.uniform(0.8, 1.2)
        points.append((step, value))
    return points


EVENTS = [
    (503, "first anomalous point", "first_anomalous_point"),
    (506, "alert", "alert_raised"),
    (557, "alert", "alert_raised"),
    (558, "stopped", "checkpoint_saved"),
    (558, "resumed", "resumed"),
]


@pytest.mark.parametrize(
    ("value", "step", "text"),
    [
        (0, None, "0"),
        (0.02, None, "0.02"),
        (0.25, 0.05, "0.25"),
        (0.5, 0.25, "0.5"),
        (0.75, 0.25, "0.75"),
        (1234, None, "1.234k"),
        (1500, 500, "1.5k"),
        (2_000_000, 1_000_000, "2M"),
        (3.5e33, None, "3.5e33"),
        (3.5e33, 5e32, "3.5e33"),
        (1e33, 5e32, "1e33"),
        (0.00012, None, "1.2e-4"),
        (-0.25, 0.05, "-0.25"),
        (math.nan, None, "NaN"),
        (math.inf, None, "Inf"),
        (None, None, "—"),
    ],
)
def test_numbers_read_like_a_person_writes_them(value, step, text):
    assert format_number(value, step) == text


def test_the_healthy_range_leaves_the_explosion_out():
    points = demo_episode()
    low, high = healthy_range(points, [503, 506, 557, 558])
    healthy = [v for s, v in points if math.isfinite(v) and not 500 <= s <= 558]
    assert low <= min(healthy) * 1.001 and high >= max(healthy) * 0.999
    assert high < 0.1
    # Without anchors nothing is an episode: a handful of points are all healthy.
    assert healthy_range([(0, 1.0), (1, 3.0)], []) == (1.0, 3.0)
    assert healthy_range([(0, math.nan)], [0]) is None


def test_the_demo_curve_is_no_flat_line_and_its_labels_are_short_and_apart():
    drawn = chart(demo_episode(), EVENTS, metric="loss")
    plot = drawn.bottom - drawn.top
    ys = [float(xy.split(",")[1]) for segment in drawn.segments for xy in segment.split()]
    healthy_ys = [y for y in ys if drawn.top < y < drawn.bottom]
    assert (max(healthy_ys) - min(healthy_ys)) / plot >= 0.5
    assert len(drawn.y_ticks) >= 3 and all(len(t.text) <= 7 for t in drawn.y_ticks)
    assert all(drawn.top - 1 <= t.at <= drawn.bottom + 1 for t in drawn.y_ticks)
    assert drawn.left >= max(len(t.text) for t in drawn.y_ticks) * 6  # room for the labels
    assert len(drawn.clipped_above) > 5 and drawn.clip_note.endswith("up to 3.52e33")
    steps = [int(t.text) for t in drawn.x_ticks]  # whole steps, round, left to right
    assert len(steps) >= 3 and steps == sorted(steps) and all(s % 100 == 0 for s in steps)
    shown = [m for m in drawn.markers if m.shown]
    assert {m.label for m in shown} == {"first anomalous point", "alert", "stopped", "resumed"}
    for i, a in enumerate(shown):
        assert a.label_x + a.label_width <= drawn.right + 0.5
        for b in shown[i + 1 :]:
            apart = a.label_y != b.label_y or (
                a.label_x + a.label_width <= b.label_x or b.label_x + b.label_width <= a.label_x
            )
            assert apart, (a, b)


def test_downsampling_keeps_every_non_finite_point_and_the_last():
    points = [(step, 1.0) for step in range(5000)]
    points[1234] = (1234, math.nan)
    kept = downsample(points, limit=100)
    assert len(kept) <= 102
    assert any(step == 1234 and math.isnan(value) for step, value in kept)
    assert kept[-1] == (4999, 1.0)


@pytest.mark.parametrize(
    ("points", "events", "segments", "nonfinite", "markers"),
    [
        ([], [], None, None, None),
        ([(0, 1.0), (10, 3.0), (5, math.nan)], [(5, "alert", "alert_raised")], 2, 1, 1),
        ([(0, 2.0), (10, 2.0)], [], 1, 0, 0),  # flat: drawn across the middle
        ([(0, math.inf)], [], 0, 1, 0),  # nothing finite: only the mark
    ],
)
def test_the_curve_maps_steps_and_values_into_the_box(points, events, segments, nonfinite, markers):
    drawn = chart(points, events, width=300, height=160, pad=20)
    if segments is None:
        assert drawn is None
        return
    assert (len(drawn.segments), len(drawn.nonfinite), len(drawn.markers)) == (
        segments,
        nonfinite,
        markers,
    )
    for segment in drawn.segments:
        for xy in segment.split():
            x, y = map(float, xy.split(","))
            assert drawn.left <= x <= drawn.right and drawn.top <= y <= drawn.bottom
    if points == [(0, 2.0), (10, 2.0)]:
        y = float(drawn.segments[0].split()[0].split(",")[1])
        assert y == pytest.approx((drawn.top + drawn.bottom) / 2, abs=1)


def test_a_decaying_sawtooth_into_a_nan_is_no_run_up():
    points = [(s, 2.0 + 1.0 / (1 + s / 200) + (s % 5) * 0.004) for s in range(400)]
    points.append((400, math.nan))
    low, high = healthy_range(points, [400, 400])
    assert low == pytest.approx(min(v for _, v in points[:-1]))
    assert high == pytest.approx(3.0)
