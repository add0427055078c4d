"""Streaming detectors: numerics, edge cases, serialisation. Pure Python — no Django, no DB."""

from __future__ import annotations

import json
import math
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from breakers.detection.detectors import (
    ANOMALOUS,
    HEALTHY,
    PENDING,
    UNKNOWN,
    RollingStats,
    build_detector,
)
from breakers.detection.engine import Point

NAN, INF = math.nan, math.inf


def series(values, start_time=0.0, interval=1.0, name="loss", node=None):
    """Points with steps 0.. and evenly spaced times."""
    return [
        Point(name, step, start_time + step * interval, float(value), node)
        for step, value in enumerate(values)
    ]


def states(detector, points):
    return [detector.observe(point).state for point in points]


def noisy(n, level=10.0, sigma=0.1, seed=1):
    rng = random.Random(seed)
    return [level + sigma * rng.gauss(0.0, 1.0) for _ in range(n)]


# --------------------------------------------------------------------------- RollingStats


def naive_variance(values):
    """The textbook one-pass formula the engine must NOT use."""
    n = len(values)
    total = sum(values)
    squares = sum(v * v for v in values)
    return squares / n - (total / n) ** 2


def test_large_offset_tiny_variance_is_exact_where_naive_sums_fail():
    rng = random.Random(7)
    values = [1e4 + 1e-6 * rng.gauss(0.0, 1.0) for _ in range(5000)]
    stats = RollingStats(window=200)
    for t, v in enumerate(values):
        stats.add(float(t), v)
    window = values[-200:]
    reference = statistics.pstdev(window)
    assert math.isclose(stats.mean(), statistics.fmean(window), rel_tol=1e-15)
    assert math.isclose(stats.std(), reference, rel_tol=1e-9)
    # The data really exercises the problem: the naive formula is off by orders of magnitude.
    naive = naive_variance(window)
    assert not math.isclose(max(naive, 0.0), reference**2, rel_tol=0.5)


def test_time_window_keeps_only_points_of_the_last_span_seconds():
    stats = RollingStats(span=10.0)
    times = [0.0, 1.0, 2.5, 9.0, 12.0, 12.5, 19.0, 22.0]
    for i, t in enumerate(times):
        stats.expire(t)
        stats.add(t, float(i))
    # At t = 22 the window is (12, 22]: the points at 12.5, 19 and 22.
    assert stats.count == 3
    assert stats.mean() == pytest.approx(statistics.fmean([5.0, 6.0, 7.0]))
    stats.expire(40.0)
    assert stats.count == 0


def test_step_window_keeps_the_last_w_points():
    stats = RollingStats(window=3)
    for i, v in enumerate([1.0, 2.0, 3.0, 10.0, 20.0]):
        stats.add(float(i), v)
    assert stats.count == 3
    assert stats.mean() == pytest.approx(statistics.fmean([3.0, 10.0, 20.0]))
    assert stats.std() == pytest.approx(statistics.pstdev([3.0, 10.0, 20.0]))


def test_sigma_is_exact_after_a_huge_outlier_leaves_the_window():
    stats = RollingStats(window=50)
    values = (
        [1.0 + 1e-9 * (i % 7) for i in range(50)]
        + [1e12]
        + [1.0 + 1e-9 * (i % 5) for i in range(60)]
    )
    for i, v in enumerate(values):
        stats.add(float(i), v)
    window = values[-50:]
    assert math.isclose(stats.std(), statistics.pstdev(window), rel_tol=1e-9)


def test_level_shift_far_from_the_shift_reference_is_exact():
    stats = RollingStats(window=100)
    rng = random.Random(3)
    values = [1e4 + rng.gauss(0, 1) for _ in range(100)]
    values += [-5.0 + 1e-7 * rng.gauss(0, 1) for _ in range(150)]
    for i, v in enumerate(values):
        stats.add(float(i), v)
    window = values[-100:]
    assert math.isclose(stats.std(), statistics.pstdev(window), rel_tol=1e-9)
    assert math.isclose(stats.mean(), statistics.fmean(window), rel_tol=1e-15)


def test_recomputation_is_amortised(monkeypatch):
    calls = []
    original = RollingStats._recompute

    def counting(self):
        calls.append(1)
        original(self)

    monkeypatch.setattr(RollingStats, "_recompute", counting)
    stats = RollingStats(window=100)
    rng = random.Random(5)
    for i in range(20_000):
        stats.add(float(i), 2.0 + 8.0 * math.exp(-i / 5000) + 0.05 * rng.gauss(0, 1))
    # Two updates (add + evict) per point, one recomputation per 2n + 64 updates at most.
    assert len(calls) <= 20_000 * 2 // (2 * 100 + 64) + 5


finite_floats = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(
    offset=st.sampled_from([0.0, 1.0, -3.5, 1e4, -1e4, 1e6]),
    scale=st.sampled_from([1e-6, 1e-3, 1.0, 1e3]),
    noise=st.lists(finite_floats, min_size=1, max_size=300),
    window=st.integers(min_value=1, max_value=64),
    by_time=st.booleans(),
)
def test_streaming_mean_and_sigma_equal_recomputation(offset, scale, noise, window, by_time):
    values = [offset + scale * x / 1e3 for x in noise]
    stats = RollingStats(span=float(window)) if by_time else RollingStats(window=max(window, 1))
    for i, value in enumerate(values):
        stats.expire(float(i))
        stats.add(float(i), value)
        current = values[max(0, i - window + 1) : i + 1]
        assert stats.count == len(current)
        ref_mean = statistics.fmean(current)
        ref_std = statistics.pstdev(current)
        magnitude = max(abs(v) for v in current)
        # Squares of spreads below ~1e-154 underflow to 0 (far below any σ floor): 1e-140.
        tiny = max(1e-13 * magnitude, 1e-140)
        assert math.isclose(stats.mean(), ref_mean, rel_tol=1e-12, abs_tol=1e-15 * magnitude)
        assert math.isclose(stats.std(), ref_std, rel_tol=1e-9, abs_tol=tiny)


# --------------------------------------------------------------------------- deviation


def first_anomalous(detector, points):
    for index, point in enumerate(points):
        if detector.observe(point).state == ANOMALOUS:
            return index
    return None


FLAT_THEN = [2.0] * 20


@pytest.mark.parametrize(
    ("case", "params", "values", "expected_first_anomalous"),
    [
        (
            "warm-up: an outlier before the window is full raises nothing",
            {"k": 3, "window": 10},
            [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.02, 0.98, 50.0],
            None,
        ),
        (
            "the first judged point is the one after a full window",
            {"k": 3, "window": 10},
            [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.02, 0.98, 1.0, 50.0],
            10,
        ),
        (
            "min_points shortens the warm-up",
            {"k": 3, "window": 100, "min_points": 5},
            [1.0, 1.1, 0.9, 1.0, 1.05, 50.0],
            5,
        ),
        (
            "flat series, change within the relative σ floor: healthy",
            {"k": 3, "window": 20},
            FLAT_THEN + [2.0000001, 2.0 - 1e-7],
            None,
        ),
        (
            "flat series, a real change: no division by zero, it fires",
            {"k": 3, "window": 20},
            FLAT_THEN + [2.5],
            20,
        ),
        (
            "flat zero series, change below the absolute floor: healthy",
            {"k": 3, "window": 20},
            [0.0] * 20 + [1e-13],
            None,
        ),
        (
            "direction above ignores a drop",
            {"k": 3, "window": 20, "direction": "above"},
            noisy(20) + [5.0, 5.0, 20.0],
            22,
        ),
        (
            "direction below ignores a rise",
            {"k": 3, "window": 20, "direction": "below"},
            noisy(20) + [20.0, 0.0],
            21,
        ),
        (
            "sustain_points needs consecutive deviating points",
            {"k": 3, "window": 20, "sustain_points": 3, "baseline": "freeze"},
            noisy(20) + [20.0, 20.0, 10.0, 20.0, 20.0, 20.0],
            25,
        ),
    ],
)
def test_deviation_cases(case, params, values, expected_first_anomalous):
    detector = build_detector("deviation", params)
    assert first_anomalous(detector, series(values)) == expected_first_anomalous, case


def test_large_offset_tiny_variance_detects_real_ten_sigma_moves_only():
    rng = random.Random(11)
    base = [1e4 + 1e-6 * rng.gauss(0, 1) for _ in range(300)]
    exact = build_detector("deviation", {"k": 4, "window": 200, "sigma_floor_rel": 0.0})
    assert all(s in (UNKNOWN, HEALTHY) for s in states(exact, series(base)))
    assert exact.observe(Point("loss", 300, 300.0, 1e4 + 1e-5)).state == ANOMALOUS
    assert exact.observe(Point("loss", 301, 301.0, 1e4 + 5e-7)).state == HEALTHY
    # With the default relative floor (1e-4·|mean| = 1.0) the same 1e-5 move is noise.
    floored = build_detector("deviation", {"k": 4, "window": 200})
    states(floored, series(base))
    assert floored.observe(Point("loss", 300, 300.0, 1e4 + 1e-5)).state == HEALTHY


def test_nan_inside_the_window_does_not_poison_later_statistics():
    values = noisy(60)
    with_nan = values[:30] + [NAN, INF, -INF] + values[30:]
    clean = build_detector("deviation", {"k": 3, "window": 25})
    dirty = build_detector("deviation", {"k": 3, "window": 25})
    clean_states = states(clean, series(values))
    dirty_states = states(dirty, series(with_nan))
    assert dirty_states[30:33] == [UNKNOWN] * 3
    assert dirty_states[:30] + dirty_states[33:] == clean_states
    assert dirty.stats.mean() == clean.stats.mean()
    assert dirty.stats.std() == clean.stats.std()
    assert math.isfinite(dirty.stats.mean())


def test_window_in_seconds_forgets_across_a_gap_where_a_step_window_does_not():
    before = series(noisy(60, level=10.0))
    after = [Point("loss", 60 + i, 200.0 + i, 20.0 + 0.01 * i, None) for i in range(5)]
    by_steps = build_detector("deviation", {"k": 3, "window": 50})
    by_seconds = build_detector("deviation", {"k": 3, "window_seconds": 50.0, "min_points": 5})
    states(by_steps, before)
    states(by_seconds, before)
    assert states(by_steps, after)[0] == ANOMALOUS  # judged against the 50 points before
    # The 50-second window expired during the 140 s gap: warm-up again, then the new level.
    assert states(by_seconds, after) == [UNKNOWN] * 5


def test_sustained_deviation_in_seconds_reports_the_start_of_the_run():
    base = noisy(300, level=2.0, sigma=0.05)
    shifted = [2.6 + 0.05 * x for x in noisy(700, level=0.0, sigma=1.0, seed=2)]
    detector = build_detector("sustained", {"k": 4, "window": 200, "sustain_seconds": 600.0})
    verdicts = [detector.observe(p) for p in series(base + shifted)]
    first = next(i for i, v in enumerate(verdicts) if v.state == ANOMALOUS)
    assert first == 900  # the shift starts at step 300 (t = 300 s); 600 s later
    assert verdicts[first].since_step == 300
    assert verdicts[first].since_time == 300.0
    assert all(v.state == PENDING for v in verdicts[300:900])
    assert all(v.state == ANOMALOUS for v in verdicts[900:])


def test_sustained_deviation_in_steps():
    detector = build_detector("sustained", {"k": 3, "window": 20, "sustain_points": 5})
    assert first_anomalous(detector, series(noisy(20) + [20.0] * 6)) == 24


@pytest.mark.parametrize(("baseline", "fires"), [("freeze", True), ("absorb", False)])
def test_baseline_freeze_keeps_a_sustained_divergence_counting(baseline, fires):
    # +8σ level shift held for 11 minutes; the 100-step baseline would swallow it in ~100 s.
    values = noisy(200, level=2.0, sigma=0.05) + noisy(660, level=2.4, sigma=0.05, seed=9)
    detector = build_detector(
        "sustained", {"k": 4, "window": 100, "sustain_seconds": 600.0, "baseline": baseline}
    )
    assert (first_anomalous(detector, series(values)) is not None) == fires


def test_frozen_baseline_does_not_freeze_on_an_unwatched_drop():
    values = noisy(100, level=2.0, sigma=0.05) + noisy(300, level=1.0, sigma=0.05, seed=4)
    detector = build_detector(
        "sustained", {"k": 4, "window": 100, "direction": "above", "sustain_points": 3}
    )
    states(detector, series(values))
    assert detector.frozen_points == 0
    assert detector.stats.mean() == pytest.approx(1.0, abs=0.02)  # the drop was absorbed


def test_max_freeze_relearns_the_baseline_after_a_permanent_level_change():
    values = noisy(100, level=2.0, sigma=0.05) + noisy(400, level=3.0, sigma=0.05, seed=4)
    detector = build_detector(
        "sustained",
        {
            "k": 4,
            "window": 100,
            "sustain_seconds": 60.0,
            "max_freeze_seconds": 120.0,
            "min_points": 20,
        },
    )
    result = states(detector, series(values))
    assert ANOMALOUS in result[100:230]
    assert result[-1] == HEALTHY  # the new level became the baseline


@pytest.mark.parametrize(("grace", "expected"), [(0, None), (1, 26)])
def test_grace_points_tolerate_a_dip_inside_a_sustained_run(grace, expected):
    values = noisy(20) + [20.0, 20.0, 20.0, 10.0, 20.0, 20.0, 20.0]
    detector = build_detector(
        "sustained", {"k": 3, "window": 20, "sustain_points": 6, "grace_points": grace}
    )
    assert first_anomalous(detector, series(values)) == expected


# --------------------------------------------------------------------------- simple kinds


@pytest.mark.parametrize(
    ("value", "expected"),
    [(NAN, ANOMALOUS), (INF, ANOMALOUS), (-INF, ANOMALOUS), (0.0, HEALTHY), (1e308, HEALTHY)],
)
def test_non_finite(value, expected):
    detector = build_detector("non_finite", {})
    verdict = detector.observe(Point("grad_norm", 7, 7.0, value))
    assert verdict.state == expected
    if expected == ANOMALOUS:
        assert verdict.since_step == 7
        assert "grad_norm is" in detector.describe("grad_norm", value, verdict)


@pytest.mark.parametrize(
    ("params", "value", "expected"),
    [
        ({"above": 0.0}, 0.0, HEALTHY),
        ({"above": 0.0}, 79.0, ANOMALOUS),
        ({"above": 0.0, "inclusive": True}, 0.0, ANOMALOUS),
        ({"below": 0.5}, 0.4, ANOMALOUS),
        ({"below": 0.5}, 0.5, HEALTHY),
        ({"above": 10.0, "below": 1.0}, 5.0, HEALTHY),
        ({"above": 10.0}, INF, ANOMALOUS),
        ({"below": 1.0}, -INF, ANOMALOUS),
        ({"above": 10.0}, NAN, UNKNOWN),
    ],
)
def test_threshold(params, value, expected):
    verdict = build_detector("threshold", params).observe(Point("gpu.0.xid", 1, 1.0, value))
    assert verdict.state == expected


# --------------------------------------------------------------------------- rising


def test_rising_fires_after_k_rising_windows_and_reports_the_first_rising_window():
    # Windows of 4 points: means 1, 2, 3, 4, 5 → 4 rises; K = 3 fires at the 4th window end.
    values = [m + d for m in (1.0, 2.0, 3.0, 4.0, 5.0) for d in (-0.1, 0.1, -0.1, 0.1)]
    detector = build_detector("rising", {"window": 4, "windows": 3, "min_rise_se": 1.0})
    verdicts = [detector.observe(p) for p in series(values)]
    assert [v.state for v in verdicts[:3]] == [UNKNOWN] * 3  # mid-window: no opinion
    assert verdicts[3].state == UNKNOWN  # first window: nothing to compare with
    assert [verdicts[i].state for i in (7, 11, 15)] == [PENDING, PENDING, ANOMALOUS]
    assert verdicts[15].since_step == 4  # the first window that rose
    assert verdicts[19].state == ANOMALOUS
    text = detector.describe("loss", values[-1], verdicts[19])
    assert "3 consecutive" not in text and "4 consecutive 4-step windows" in text


def test_rising_resets_on_a_window_that_does_not_rise():
    means = (1.0, 2.0, 3.0, 2.5, 3.0, 4.0)
    values = [m for m in means for _ in range(4)]
    detector = build_detector("rising", {"window": 4, "windows": 3})
    assert ANOMALOUS not in states(detector, series(values))


def test_rising_ignores_rises_within_noise():
    rng = random.Random(21)
    values = [2.0 + 0.06 * rng.gauss(0, 1) for _ in range(100_000)]
    detector = build_detector("rising", {"window": 50, "windows": 5, "min_rise_se": 2.0})
    assert ANOMALOUS not in states(detector, series(values))


def test_rising_on_a_flat_series_needs_more_than_the_sigma_floor():
    values = [2.0] * 4 + [2.0 + 1e-9 * i for i in range(1, 5) for _ in range(4)]
    detector = build_detector("rising", {"window": 4, "windows": 3})
    assert ANOMALOUS not in states(detector, series(values))


# --------------------------------------------------------------------------- silence


def test_silence_fires_only_on_tick_after_the_timeout():
    detector = build_detector("silence", {"timeout": 30.0})
    assert detector.tick(100.0).state == UNKNOWN  # never seen: never silent
    detector.observe(Point("heartbeat", 41, 100.0, 1.0))
    assert detector.tick(130.0).state == UNKNOWN
    verdict = detector.tick(131.0)
    assert verdict.state == ANOMALOUS
    assert (verdict.since_step, verdict.since_time, verdict.observed) == (41, 100.0, 31.0)
    assert detector.observe(Point("heartbeat", 42, 140.0, 1.0)).state == HEALTHY
    assert detector.tick(150.0).state == UNKNOWN


def test_silence_timeout_follows_the_measured_step_time():
    detector = build_detector("silence", {"timeout_factor": 5.0, "min_timeout": 4.0})
    detector.observe(Point("heartbeat", 0, 0.0, 1.0))
    assert detector.timeout() == 4.0  # one point: no interval yet, the floor applies
    for step in range(1, 50):
        detector.observe(Point("heartbeat", step, 2.0 * step, 1.0))
    assert detector.timeout() == pytest.approx(10.0)
    last = 98.0
    assert detector.tick(last + 9.0).state == UNKNOWN
    assert detector.tick(last + 11.0).state == ANOMALOUS
    # A deliberate one-hour pause does not inflate the timeout to hours: the interval sample
    # is capped at 10× the average (2 s → 20 s), so the average only moves to 5.6 s.
    detector.observe(Point("heartbeat", 50, last + 3600.0, 1.0))
    assert detector.timeout() == pytest.approx(5.0 * (2.0 + 0.2 * 18.0))


# --------------------------------------------------------------------------- node failures


def failure(node, time, step=0, value=1.0):
    return Point("node.failure", step, time, value, node)


def test_node_failures_counts_distinct_nodes_in_the_window():
    detector = build_detector("node_failures", {"min_nodes": 2, "window_seconds": 60.0})
    assert detector.observe(failure("n1", 0.0, 10)).state == HEALTHY
    assert detector.observe(failure("n1", 30.0, 11)).state == HEALTHY  # same node again
    verdict = detector.observe(failure("n2", 50.0, 12))
    assert verdict.state == ANOMALOUS
    assert verdict.nodes == ("n1", "n2")
    assert (verdict.since_step, verdict.since_time, verdict.observed) == (10, 0.0, 2.0)
    assert detector.tick(89.0).state == ANOMALOUS  # n1 (t=30) and n2 (t=50) still inside
    assert detector.tick(95.0).state == HEALTHY  # n1 left the window


def test_node_failures_outside_the_window_do_not_add_up():
    detector = build_detector("node_failures", {"min_nodes": 2, "window_seconds": 60.0})
    detector.observe(failure("n1", 0.0))
    assert detector.observe(failure("n2", 61.0)).state == HEALTHY
    assert detector.observe(failure("n3", 62.0, value=0.0)).state == HEALTHY  # not a failure


def test_node_failures_use_the_metric_name_when_the_point_has_no_node():
    detector = build_detector("node_failures", {"min_nodes": 2})
    detector.observe(Point("node.3.failure", 1, 0.0, 1.0))
    verdict = detector.observe(Point("node.4.failure", 1, 1.0, 1.0))
    assert verdict.nodes == ("node.3.failure", "node.4.failure")


# --------------------------------------------------------------------------- serialisation


def mixed_stream(n=1500, seed=13):
    """Noise, spikes, NaN/Inf, a level shift, a ramp and a time gap."""
    rng = random.Random(seed)
    points, time = [], 0.0
    for step in range(n):
        time += 1.0 if step != 700 else 400.0
        value = 2.0 + 0.05 * rng.gauss(0, 1)
        if 900 <= step < 1100:
            value += 0.6
        if step >= 1100:
            value += 0.004 * (step - 1100)
        if rng.random() < 0.01:
            value = rng.choice([NAN, INF, -INF, value * 3])
        node = f"node-{step % 3}" if rng.random() < 0.02 else None
        points.append(Point("loss", step, time, value, node))
    return points


DETECTOR_CASES = [
    ("deviation", {"k": 2.0, "window": 50, "sustain_points": 2}),
    ("deviation", {"k": 3.0, "window_seconds": 40.0, "min_points": 10}),
    (
        "sustained",
        {
            "k": 4.0,
            "window": 100,
            "sustain_seconds": 60.0,
            "grace_points": 2,
            "max_freeze_points": 150,
        },
    ),
    ("non_finite", {}),
    ("threshold", {"above": 2.3, "below": 1.8}),
    ("rising", {"window": 20, "windows": 3, "min_rise_se": 1.0}),
    ("silence", {"timeout_factor": 5.0, "min_timeout": 2.0}),
    ("node_failures", {"min_nodes": 2, "window_seconds": 300.0, "failure_above": 2.2}),
]


def run(detector, points):
    out = []
    for point in points:
        out.append(detector.observe(point))
        out.append(detector.tick(point.time + 7.0))
    return out


@pytest.mark.parametrize(("kind", "params"), DETECTOR_CASES)
@pytest.mark.parametrize("split", [1, 350, 701, 1000, 1499])
def test_round_trip_mid_stream_equals_uninterrupted_run(kind, params, split):
    points = mixed_stream()
    uninterrupted = build_detector(kind, params)
    expected = run(uninterrupted, points)
    first = build_detector(kind, params)
    head = run(first, points[:split])
    stored = json.dumps(first.to_state(), allow_nan=False)  # strict JSON
    resumed = build_detector(kind, params)
    resumed.load_state(json.loads(stored))
    assert head + run(resumed, points[split:]) == expected
    assert resumed.to_state() == uninterrupted.to_state()


def test_the_mixed_stream_exercises_every_detector():
    points = mixed_stream()
    for kind, params in DETECTOR_CASES:
        seen = {v.state for v in run(build_detector(kind, params), points)}
        assert ANOMALOUS in seen, kind


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("deviation", {"k": 3}, "exactly one of window"),
        ("deviation", {"k": 3, "window": 10, "window_seconds": 5.0}, "exactly one of window"),
        ("deviation", {"k": -1, "window": 10}, "k must be"),
        ("deviation", {"k": 3, "window": 1}, "window must be"),
        ("deviation", {"k": 3, "window": 10, "direction": "up"}, "direction"),
        ("deviation", {"k": 3, "window": 10, "treshold": 2}, "treshold"),
        ("deviation", {"k": True, "window": 10}, "k must be"),
        ("sustained", {"k": 3, "window": 10}, "sustain_seconds"),
        ("rising", {"window": 10, "windows": 0}, "windows must be"),
        ("silence", {}, "exactly one of timeout"),
        ("threshold", {}, "above and/or below"),
        ("threshold", {"above": NAN}, "above must be"),
        ("node_failures", {"min_nodes": 0}, "min_nodes"),
        ("spectral", {}, "unknown detector kind"),
    ],
)
def test_invalid_parameters_are_refused(kind, params, message):
    with pytest.raises(ValueError, match=message):
        build_detector(kind, params)
