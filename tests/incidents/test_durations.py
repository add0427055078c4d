"""The chain's measured durations, table-driven (pure: runs with -p no:django in milliseconds)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from incidents.reviews.durations import (
    LINK_KEYS,
    DeclaredSize,
    Row,
    format_seconds,
    link_stats,
    measure,
    percentile,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def r(kind: str, seconds: float, step: int | None = None) -> Row:
    return Row(kind, T0 + timedelta(seconds=seconds), step)


def ra(kind: str, seconds: float, step: int | None = None, *, alert: int) -> Row:
    return Row(kind, T0 + timedelta(seconds=seconds), step, alert_id=alert)


FULL = [
    r("first_anomalous_point", 0, 100),
    r("alert_raised", 4, 100),
    r("command_issued", 4),
    r("notification_sent", 5),
    r("notification_delivered", 7),
    r("acknowledged", 30, 101),
    r("command_acknowledged", 10, 103),  # rows are in timeline order, as given
    r("checkpoint_saved", 10, 103),
    r("resumed", 70, 103),
]

# name, rows, expected (seconds, steps, end kind) per link: detect, notify, ack, brake, recover
CASES = [
    (
        "the whole chain",
        FULL,
        {
            "detect": (4, 0, "alert_raised"),
            "notify": (3, None, "notification_delivered"),
            "acknowledge": (26, 1, "acknowledged"),
            "brake": (6, 3, "checkpoint_saved"),
            "recover": (60, 0, "resumed"),
        },
    ),
    (
        "no notification rows: not measured",
        [row for row in FULL if not row.kind.startswith("notification")],
        {"notify": (None, None, None), "brake": (6, 3, "checkpoint_saved")},
    ),
    (
        "sent but never delivered: measured to the sending",
        [row for row in FULL if row.kind != "notification_delivered"],
        {"notify": (1, None, "notification_sent")},
    ),
    (
        "a delivery is preferred even after a later sending",
        [r("alert_raised", 0), r("notification_sent", 2), r("notification_delivered", 9)],
        {"notify": (9, None, "notification_delivered")},
    ),
    (
        "terminated instead of paused: braked for good, nothing to recover",
        [r("alert_raised", 2, 110), r("terminated", 5, 112)],
        {"detect": (2, 10, "alert_raised"), "brake": (3, 2, "terminated"), "recover": (None,) * 3},
    ),
    (
        "no alert: only the detect start is known",
        [r("note", 3)],
        {key: (None, None, None) for key in LINK_KEYS},
    ),
    (
        "a stop before the alert does not count",
        [r("checkpoint_saved", 1, 5), r("alert_raised", 2, 5), r("checkpoint_saved", 8, 9)],
        {"brake": (6, 4, "checkpoint_saved")},
    ),
    (
        "the first alert of the episode starts the links, not the one that braked",
        [r("alert_raised", 5, 100), r("alert_raised", 65, 160), r("checkpoint_saved", 70, 161)],
        {"detect": (5, 0, "alert_raised"), "brake": (65, 61, "checkpoint_saved")},
    ),
    (
        "the brake is measured from the alert whose command stopped training",
        [
            ra("alert_raised", 5, 100, alert=1),  # L1, notify only
            ra("alert_raised", 6.9, 119, alert=2),  # L3: its checkpoint_and_pause braked
            ra("acknowledged", 30, 130, alert=1),
            ra("checkpoint_saved", 6.91, 119, alert=2),
        ],
        {
            "detect": (5, 0, "alert_raised"),
            "acknowledge": (25, 30, "acknowledged"),
            "escalate": (pytest.approx(1.9), 19, "alert_raised"),
            "brake": (pytest.approx(0.01), 0, "checkpoint_saved"),
        },
    ),
    (
        "a page that failed reached nobody: the notify link ends at the one delivered",
        [
            r("alert_raised", 0),
            Row("notification_sent", T0 + timedelta(seconds=0.02), data={"status": "failed"}),
            Row("notification_sent", T0 + timedelta(seconds=3), data={"status": "sent"}),
        ],
        {"notify": (3, None, "notification_sent")},
    ),
    (
        "only failed pages: notify not measured",
        [r("alert_raised", 0), Row("notification_sent", T0, data={"status": "failed"})],
        {"notify": (None, None, None)},
    ),
    (
        "the first alert braked: escalate is nothing",
        [r("alert_raised", 2, 110), r("checkpoint_saved", 5, 112)],
        {"escalate": (0, 0, "alert_raised"), "brake": (3, 2, "checkpoint_saved")},
    ),
    (
        "an escalated alert: the brake is measured from its escalation",
        [
            ra("alert_raised", 1, 100, alert=1),
            ra("severity_changed", 40, 140, alert=1),  # L2 → L3
            ra("checkpoint_saved", 41, 141, alert=1),
        ],
        {"escalate": (39, 40, "severity_changed"), "brake": (1, 1, "checkpoint_saved")},
    ),
    (
        "an end row without a step: seconds only",
        [r("alert_raised", 1, 100), r("checkpoint_saved", 4)],
        {"brake": (3, None, "checkpoint_saved")},
    ),
    (
        "resumed twice: the first resume after the stop",
        [r("alert_raised", 1), r("resumed", 2), r("checkpoint_saved", 3), r("resumed", 50)],
        {"brake": (2, None, "checkpoint_saved"), "recover": (47, None, "resumed")},
    ),
]


@pytest.mark.parametrize("rows", [case[1] for case in CASES], ids=[c[0] for c in CASES])
def test_detect_escalate_and_brake_add_up_to_the_first_point_to_the_stop(rows):
    durations = measure(rows, T0, 100)
    chain = [durations.link(key) for key in ("detect", "escalate", "brake")]
    if all(link.measured for link in chain):
        assert sum(link.seconds or 0.0 for link in chain) == pytest.approx(
            (chain[-1].end_at - T0).total_seconds()
        )
        assert [link.start_at for link in chain[1:]] == [link.end_at for link in chain[:-1]]


@pytest.mark.parametrize(("name", "rows", "expected"), CASES, ids=[c[0] for c in CASES])
def test_each_link_is_measured_between_its_rows(name, rows, expected):
    durations = measure(rows, T0, 100)
    for key, (seconds, steps, end_kind) in expected.items():
        link = durations.link(key)
        assert (link.seconds, link.steps, link.end_kind) == (seconds, steps, end_kind), key


@pytest.mark.parametrize(
    ("rows", "size", "hours", "accelerators"),
    [
        (FULL, DeclaredSize(4, 8), 32 * 10 / 3600, 32),  # first point → checkpoint: 10 s
        (FULL, None, None, None),
        ([r("alert_raised", 4)], DeclaredSize(2, 8), None, 16),  # never braked
        ([r("alert_raised", 4), r("terminated", 3600)], DeclaredSize(1, 0), 0.0, 0),
        ([r("alert_raised", 1), r("terminated", 7200)], DeclaredSize(64, 8), 1024.0, 512),
    ],
)
def test_accelerator_hours_run_from_the_first_point_to_the_brake(rows, size, hours, accelerators):
    durations = measure(rows, T0, 100, size)
    if hours is None:
        assert durations.accelerator_hours is None
    else:
        assert durations.accelerator_hours == pytest.approx(hours)
    assert durations.accelerators == accelerators


def test_the_slowest_link_is_the_longest_measured_one():
    durations = measure(FULL, T0, 100)
    assert durations.slowest.key == "recover"
    assert measure([r("note", 1)], T0, 0).slowest is None
    as_dict = durations.as_dict()
    assert as_dict["slowest"] == "recover" and [x["key"] for x in as_dict["links"]] == list(
        LINK_KEYS
    )
    assert as_dict["links"][0]["start_at"] == "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 50, None),
        ([7.0], 90, 7.0),
        ([1, 2, 3, 4], 50, 2.5),
        ([4, 1, 3, 2], 90, 3.7),
        (list(range(1, 11)), 90, 9.1),
        (list(range(1, 11)), 0, 1),
        (list(range(1, 11)), 100, 10),
        ([10, 20, 60], 50, 20),
        ([10, 20, 60], 90, 52),
    ],
)
def test_percentiles_interpolate_between_closest_ranks(values, q, expected):
    assert percentile(values, q) == (pytest.approx(expected) if expected is not None else None)


@pytest.mark.parametrize("q", [-1, 100.5])
def test_a_percentile_outside_0_100_is_refused(q):
    with pytest.raises(ValueError):
        percentile([1.0], q)


def test_link_stats_count_only_incidents_where_the_link_was_measured():
    episodes = [
        measure([r("alert_raised", 1), r("checkpoint_saved", 1 + brake)], T0, 0)
        for brake in (10, 20, 60)
    ] + [measure([r("alert_raised", 1)], T0, 0)]
    stats = link_stats(episodes)
    assert stats["brake"].as_dict() == {"measured": 3, "median": 20.0, "p90": 52.0}
    assert stats["detect"].measured == 4 and stats["detect"].median == 1.0
    assert stats["notify"].as_dict() == {"measured": 0, "median": None, "p90": None}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "not measured"),
        (0.25, "250 ms"),
        (4.0, "4 s"),
        (4.25, "4.2 s"),
        (59.96, "60 s"),
        (363, "6 min 3 s"),
        (600, "10 min"),
        (9000, "2 h 30 min"),
        (7200, "2 h"),
        (-3, "-3 s"),
    ],
)
def test_durations_read_as_people_say_them(seconds, text):
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(
    ("steps", "phrase"),
    [(None, ""), (0, "0 steps"), (40, "40 steps"), (-157, "157 steps rolled back")],
)
def test_a_link_that_ends_at_an_earlier_step_says_how_far_it_rolled_back(steps, phrase):
    from incidents.reviews.durations import steps_phrase

    assert steps_phrase(steps) == phrase
