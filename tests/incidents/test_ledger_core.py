"""The goodput ledger's arithmetic, table-driven (pure: runs with -p no:django)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest

from incidents.reviews.durations import Row, measure
from incidents.reviews.ledger import PHASES, JobSpan, incident_cost, ledger, week_starts
from incidents.reviews.ledger_export import COLUMNS, ledger_csv

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)  # a Monday


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def r(kind: str, seconds: float, step: int | None = None, alert: int | None = 1) -> Row:
    return Row(kind, at(seconds), step, alert_id=alert)


AUTOMATIC = [  # NaN at 10 s; L3 at 13 s braked at once; saved at 21 s; resumed at 103 s
    r("first_anomalous_point", 10, 60, None),
    r("alert_raised", 13, 60),
    r("command_issued", 13, 60),
    r("checkpoint_saved", 21, 62),
    r("resumed", 103, 62, None),
]
DECIDED = [  # an L2 at 13 s; a person escalates to L3 at 73 s; saved at 80 s; never resumed
    r("first_anomalous_point", 10, 60, None),
    r("alert_raised", 13, 60),
    r("severity_changed", 73, 70),
    r("checkpoint_saved", 80, 71),
]
NOT_BRAKED = [r("first_anomalous_point", 10, 60, None), r("alert_raised", 12, 61)]


def cost(rows, restored=None, held=3600.0, incident=1, job=1):
    durations = measure(rows, at(10), 60)
    restored_at = at(restored) if restored is not None else None
    return incident_cost(
        (incident, job, "t", "L3"), durations, at(10), restored_at=restored_at, held_until=at(held)
    )


@pytest.mark.parametrize(
    ("rows", "restored", "held", "phases", "alarm", "brake"),
    [
        # phases: lost_progress, detection, decision, saving, recovery
        (AUTOMATIC, None, 3600, (0, 3, 0, 8, 82), (3, 0), (11, 2)),
        (AUTOMATIC, -50, 3600, (60, 3, 0, 8, 82), (3, 0), (11, 2)),
        (AUTOMATIC, 15, 3600, (0, 3, 0, 8, 82), (3, 0), (11, 2)),  # a checkpoint after the NaN
        (DECIDED, None, 500, (0, 3, 60, 7, 420), (3, 0), (70, 11)),  # held until 500 s
        (NOT_BRAKED, None, 3600, (0, 2, 0, 0, 0), (2, 1), (None, None)),
    ],
    ids=["automatic", "rolled-back", "restored-after-the-fault", "decided-held", "not-braked"],
)
def test_an_incident_costs_its_phases(rows, restored, held, phases, alarm, brake):
    found = cost(rows, restored, held)
    assert tuple(found.phases[name] for name in PHASES) == phases
    assert (found.alarm_seconds, found.alarm_steps) == alarm
    assert (found.brake_seconds, found.brake_steps) == brake
    assert found.lost_seconds == sum(phases)


def span(job=1, start=-3600.0, end=None, accelerators=32):
    return JobSpan(job, f"job-{job}", at(start), at(end) if end is not None else None, accelerators)


@pytest.mark.parametrize(
    ("jobs", "costs", "wall", "lost", "ettr", "hours", "lost_hours"),
    [
        ([span()], [cost(AUTOMATIC)], 7200, 93, 7107 / 7200, 64.0, 32 * 93 / 3600),
        ([span(accelerators=None)], [cost(AUTOMATIC)], 7200, 93, 7107 / 7200, None, None),
        ([span(end=0)], [], 3600, 0, 1.0, 32.0, 0.0),  # ended before the incident
        (
            [span(), span(2, start=0, accelerators=8)],
            [cost(AUTOMATIC, job=2)],
            10800,
            93,
            (10800 - 93) / 10800,
            72.0,
            8 * 93 / 3600,
        ),
        ([span(start=0, end=50)], [cost(AUTOMATIC)], 50, 50, 0.0, 32 * 50 / 3600, 32 * 50 / 3600),
    ],
    ids=["one-job", "no-size", "ended-early", "two-jobs", "cost-clipped-to-the-run"],
)
def test_the_ledger_adds_up(jobs, costs, wall, lost, ettr, hours, lost_hours):
    result = ledger(jobs, costs, at(-3600), at(3600))
    assert result.total.wall_seconds == wall
    assert result.total.lost_seconds == pytest.approx(lost, abs=1e-9)
    assert result.total.ettr == pytest.approx(ettr)
    assert result.total.accelerator_hours == (pytest.approx(hours) if hours is not None else None)
    if lost_hours is None:
        assert result.total.lost_accelerator_hours is None
    else:
        assert result.total.lost_accelerator_hours == pytest.approx(lost_hours)


def test_an_incident_counts_in_the_week_of_its_first_anomalous_point():
    since, until = at(-6 * 86400), at(3600)
    result = ledger([span(start=-6 * 86400)], [cost(AUTOMATIC)], since, until)
    (w1, first), (w2, second) = result.weeks
    assert (w1, w2) == (datetime(2026, 2, 23, tzinfo=UTC), datetime(2026, 3, 2, tzinfo=UTC))
    assert first.incidents == 0 and first.ettr == 1.0
    assert first.wall_seconds == (datetime(2026, 3, 2, tzinfo=UTC) - since).total_seconds()
    assert second.incidents == 1 and second.lost_seconds == 93
    assert second.wall_seconds == 9 * 3600 + 3600
    assert result.total.wall_seconds == first.wall_seconds + second.wall_seconds


@pytest.mark.parametrize(
    ("since", "until", "weeks"),
    [
        (datetime(2026, 3, 2, tzinfo=UTC), datetime(2026, 3, 3, tzinfo=UTC), 1),
        (datetime(2026, 3, 1, 23, tzinfo=UTC), datetime(2026, 3, 2, 1, tzinfo=UTC), 2),
        (datetime(2026, 3, 4, tzinfo=UTC), datetime(2026, 4, 4, tzinfo=UTC), 5),
    ],
)
def test_weeks_begin_on_monday(since, until, weeks):
    starts = week_starts(since, until)
    assert len(starts) == weeks and all(s.weekday() == 0 and s.hour == 0 for s in starts)


def test_the_csv_has_a_row_per_scope_and_quotes_formulas():
    result = ledger(
        [JobSpan(1, "=HYPERLINK(1)", at(-3600), None, 32)], [cost(AUTOMATIC)], at(-3600), at(3600)
    )
    document = {
        "since": "s",
        "total": result.total.as_dict(),
        "weeks": [{"week": "w", **line.as_dict()} for _, line in result.weeks],
        "jobs": [
            {"id": 1, "name": "=HYPERLINK(1)", "accelerators": 32, **result.jobs[0][1].as_dict()}
        ],
        "incidents": [
            {
                "id": 1,
                "job": "=HYPERLINK(1)",
                "first_at": "f",
                "lost": result.incidents[0].phases,
                "lost_seconds": 93.0,
                "lost_accelerator_hours": 32 * 93 / 3600,
                "alarm_after_seconds": 3.0,
                "alarm_after_steps": 0,
                "brake_after_seconds": 11.0,
                "brake_after_steps": 2,
            }
        ],
    }
    rows = list(csv.DictReader(io.StringIO(ledger_csv(document))))
    assert [row["scope"] for row in rows] == ["total", "week", "job", "incident"]
    assert list(rows[0]) == list(COLUMNS)
    assert rows[2]["name"] == "'=HYPERLINK(1)" and rows[3]["name"] == "'=HYPERLINK(1)"
    assert rows[3]["lost_recovery_seconds"] == "82.0" and rows[3]["brake_after_steps"] == "2"
    assert rows[0]["wall_seconds"] == "7200.0" and rows[0]["ettr"] == str(7107 / 7200)
