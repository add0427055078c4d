"""How a shadow rule compares with the real incidents, table-driven (pure: -p no:django)."""

from __future__ import annotations

import pytest

from breakers.detection.shadow_core import (
    LEAD_SECONDS,
    Firing,
    RealIncident,
    compare,
    in_intervals,
    shadow_intervals,
)

# Job 1's incident: first anomalous point at 1,000 s, alarm at 1,003 s (step 500), resolved at
# 2,000 s. Job 2's: 5,000 s → alarm 5,010 s (step 900), still open.
ONE = RealIncident(1, 1, 1000.0, 1003.0, 500, 2000.0)
TWO = RealIncident(2, 2, 5000.0, 5010.0, 900, None)


@pytest.mark.parametrize(
    ("firings", "expected"),
    [
        ([], (0, 0, 0, 0, 0, None, None)),
        # 200 s and 40 steps before the real alarm: inside the lead, caught early.
        ([Firing(1, 803.0, 460)], (1, 1, 1, 0, 1, -200.0, -40.0)),
        # Before the lead window: a would-have-fired event no incident explains.
        ([Firing(1, 1000.0 - LEAD_SECONDS - 1, 10)], (1, 1, 0, 1, 0, None, None)),
        # After the incident resolved, and on the wrong job: both outside.
        ([Firing(1, 2001.0, 900), Firing(3, 1500.0, 700)], (2, 2, 0, 2, 0, None, None)),
        # Both incidents caught, later than the real alarms by 7 s / 2 steps and 20 s / 5 steps;
        # the earliest event of each counts.
        (
            [Firing(1, 1010.0, 502), Firing(1, 1500.0, 600), Firing(2, 5030.0, 905)],
            (3, 2, 3, 0, 2, 13.5, 3.5),
        ),
    ],
    ids=["nothing", "early", "before-the-lead", "outside", "both-late"],
)
def test_compare(firings, expected):
    result = compare(firings, [ONE, TWO])
    assert (
        result.fired,
        result.jobs,
        result.inside,
        result.outside,
        result.caught,
        result.median_lead_seconds,
        result.median_lead_steps,
    ) == expected
    assert result.incidents == 2


@pytest.mark.parametrize(
    ("versions", "intervals"),
    [
        ([], []),
        ([(1.0, False), (2.0, False)], []),
        ([(1.0, True), (2.0, True)], [(1.0, None)]),
        ([(1.0, False), (2.0, True), (3.0, False), (4.0, True)], [(2.0, 3.0), (4.0, None)]),
    ],
)
def test_shadow_intervals(versions, intervals):
    assert shadow_intervals(versions) == intervals


def test_in_intervals_is_half_open():
    intervals = [(2.0, 3.0), (4.0, None)]
    assert [in_intervals(t, intervals) for t in (1.9, 2.0, 2.9, 3.0, 4.0, 1e12)] == [
        False,
        True,
        True,
        False,
        True,
        True,
    ]


@pytest.mark.parametrize(("shadow", "kept"), [(False, False), (True, True)])
def test_a_snapshot_keeps_shadow_only_when_it_is_set(shadow, kept):
    """A rule set that never used shadow mode keeps the fingerprint it had before the field
    existed (no spurious "changed outside the console" version on upgrade)."""
    from breakers.detection.engine import RuleSpec
    from breakers.detection.ruleset_core import diff, snapshot

    rule = RuleSpec("r", "R", "stability", "loss", "non_finite", shadow=shadow).to_dict()
    snap = snapshot([rule], {})
    assert ("shadow" in snap["rules"]["r"]) is kept
    without = {k: v for k, v in rule.items() if k != "shadow"}
    assert diff(snapshot([without], {}), snap) == (
        [
            {
                "kind": "rule",
                "key": "r",
                "change": "changed",
                "fields": [{"field": "shadow", "old": False, "new": True}],
            }
        ]
        if shadow
        else []
    )
