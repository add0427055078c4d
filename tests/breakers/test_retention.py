"""Retention of raw points on the beat: a configurable raw window, never what is not rolled up
yet, never the freeze around an incident; rollups kept for months. The clock is moved
(time-machine) to dates of 2026's spring, never today's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.models import MetricRollup
from breakers.storage import retention, rollups
from breakers.storage.points import stored_points
from incidents.models import Incident, IncidentStatus

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def one_a_minute(job_id: int, steps: range, ranks: int = 1) -> None:
    """A step a minute, each its own batch as the SDK sends it (retention keeps or deletes a
    block whole: a batch of one step is a block of one step)."""
    for s in steps:
        store_points(
            job_id, [PointIn("loss", s, 1.0 + s % 5, at(s * 60.0), None, r) for r in range(ranks)]
        )


def remaining_steps(job_id: int) -> set[int]:
    return {p.step for p in stored_points(job_id)}


def incident(job_id: int, first_step: int, resolved_step: int | None) -> None:
    resolved = resolved_step is not None
    Incident.objects.create(
        job_id=job_id,
        title="spike",
        level="L2",
        opened_at=at(first_step * 60),
        first_step=first_step,
        first_time=at(first_step * 60),
        resolved_at=at(resolved_step * 60) if resolved else None,
        status=IncidentStatus.RESOLVED if resolved else IncidentStatus.OPEN,
    )


def test_raw_points_leave_after_the_window_but_never_around_an_incident(make_agent, settings):
    settings.METRIC_RAW_RETENTION_SECONDS = 72 * 3600
    settings.METRIC_INCIDENT_MARGIN_STEPS = 10
    settings.METRIC_ROLLUP_RETENTION_DAYS = 30
    closed, open_, quiet, unrolled = (make_agent() for _ in range(4))
    for job in (closed, open_, quiet, unrolled):
        one_a_minute(job.job_id, range(0, 1000), ranks=2 if job is closed else 1)
    for job in (closed, open_, quiet):
        rollups.roll_up_job(job.job_id)
    incident(closed.job_id, 300, resolved_step=400)  # frozen: steps 290 … 400, both ranks
    incident(open_.job_id, 500, resolved_step=None)  # active: from step 490 for ever
    with time_machine.travel(at(71 * 3600), tick=False):
        assert retention.prune() == retention.Pruned(0, 0)  # nothing is 72 h old yet
    with time_machine.travel(at(100 * 60 + 72 * 3600), tick=False):
        retention.prune()  # steps 0..99 are past the window now, 100 is not
    assert min(remaining_steps(quiet.job_id)) == 100
    with time_machine.travel(at(1100 * 60 + 72 * 3600), tick=False):
        pruned = retention.prune()
        assert retention.prune() == retention.Pruned(0, 0)  # idempotent
    assert remaining_steps(quiet.job_id) == set()
    assert remaining_steps(closed.job_id) == set(range(290, 401))  # the margin, to the close
    assert len(stored_points(closed.job_id)) == 2 * 111  # every rank
    assert remaining_steps(open_.job_id) == set(range(490, 1000))  # active: kept
    assert remaining_steps(unrolled.job_id) == set(range(1000))  # not in the rollups yet
    # Ingest wrote a block per batch and rank: here one point each, deleted block by block.
    assert pruned.blocks == 900 + 2 * (1000 - 111 - 100) + (490 - 100) and pruned.raw_points == 0
    # The rollups still count every deleted point: the long view of the run is whole.
    counts = MetricRollup.objects.filter(job_id=quiet.job_id, seconds=60)
    assert sum(counts.values_list("count", flat=True)) == 1000
    with time_machine.travel(at(500 * 60) + timedelta(days=30), tick=False):
        retention.prune()  # a month on, the older half of the rollups go
    kept = MetricRollup.objects.filter(job_id=quiet.job_id, seconds=60)
    assert min(kept.values_list("first_step", flat=True)) == 500
    with time_machine.travel(at(1000 * 60) + timedelta(days=30), tick=False):
        pruned = retention.prune()
    assert pruned.rollups > 0 and not MetricRollup.objects.exists()


def test_the_raw_window_is_a_setting_of_the_operator(make_agent, settings):
    settings.METRIC_RAW_RETENTION_SECONDS = 3600  # one hour instead of the default 72
    job = make_agent()
    one_a_minute(job.job_id, range(0, 180))  # three hours of points
    rollups.roll_up_job(job.job_id)
    with time_machine.travel(at(180 * 60), tick=False):
        retention.prune()
    assert min(remaining_steps(job.job_id)) == 120  # the last hour is still raw
