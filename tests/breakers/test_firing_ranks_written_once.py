"""Many ranks firing one alert in one chunk: one alert, one brake, a few writes.

In data-parallel training one NaN makes every rank's step guard refuse the update: the guard
rule pools the nodes (one alert per job), and the evaluator writes an alert's repeated
firings once per chunk instead of once per rank, leaving the alert as the findings written
one by one would.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.detection import evaluation
from breakers.detection.evaluation import evaluate_job
from breakers.models import Command
from incidents.models import Alert, TimelineEntry

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GUARD = "guard.skipped_updates"


def store_guard(job_id: int, ranks: range, steps: range, refused) -> None:
    """One batch: each rank's guard count per step, 8 ranks a node; ``refused(rank, step)``."""
    rows = [
        PointIn(
            GUARD, step, refused(rank, step), T0 + timedelta(seconds=step), f"gpu-{rank // 8}", rank
        )
        for step in steps
        for rank in ranks
    ]
    store_points(job_id, rows)


def counting_writes(monkeypatch) -> list[str]:
    """The rule keys of every ``raise_or_update_alert`` call the evaluator makes."""
    calls: list[str] = []
    original = evaluation.raise_or_update_alert

    def counted(job_id, signal, **kwargs):
        calls.append(signal.rule_key)
        return original(job_id, signal, **kwargs)

    monkeypatch.setattr(evaluation, "raise_or_update_alert", counted)
    return calls


def test_every_rank_refusing_one_update_is_one_alert_one_brake_and_two_writes(agent, monkeypatch):
    store_guard(agent.job_id, range(16), range(5), lambda rank, step: 0.0)
    store_guard(agent.job_id, range(16), range(5, 6), lambda rank, step: 1.0)
    calls = counting_writes(monkeypatch)
    report = evaluate_job(agent.job_id)
    alert = Alert.objects.get(job_id=agent.job_id)
    assert (alert.rule_key, alert.node, report.raised) == ("update-refused-by-guard", "", 1)
    # The first firing raises (and brakes); the fifteen others are one update at the end.
    assert calls == ["update-refused-by-guard"] * 2
    assert Command.objects.filter(job_id=agent.job_id, alert=alert).count() == 1
    assert alert.description.startswith("ranks 0, 1, 2 and 13 more firing; rank 15: ")
    assert alert.step == 5


def run_one_by_one(monkeypatch) -> None:
    """The evaluator writing every finding as it comes (each pending update written at once)."""
    apply = evaluation._Run._apply

    def apply_and_write(run, finding):
        apply(run, finding)
        run._flush()

    monkeypatch.setattr(evaluation._Run, "_apply", apply_and_write)


def refusing(rank: int, step: int) -> float:
    """Ranks 0–3 refuse from step 5, rank 0 only once; ranks 4 and 5 from steps 10 and 11."""
    start = {4: 10, 5: 11}.get(rank, 5)
    if step < start or (rank == 0 and step > 5):
        return 0.0
    return float(step + rank)


def evaluated_alert(make_agent, monkeypatch, *, one_by_one: bool) -> tuple[Alert, list, int]:
    """One chunk of six ranks' guard counts (``refusing``): rank 0's series clears at step 15,
    after the last firing: the alert, its timeline, and the writes."""
    agent = make_agent()
    store_guard(agent.job_id, range(6), range(21), refusing)
    with monkeypatch.context() as patch:
        calls = counting_writes(patch)
        if one_by_one:
            run_one_by_one(patch)
        evaluate_job(agent.job_id)
    alert = Alert.objects.get(job_id=agent.job_id)
    rows = TimelineEntry.objects.filter(incident=alert.incident).order_by("pk")
    # A command's number is its row's id: another job's, another number.
    timeline = [
        (kind, re.sub(r"#\d+", "#", message), step)
        for kind, message, step in rows.values_list("kind", "message", "step")
    ]
    return alert, timeline, len(calls)


FIELDS = (
    "rule_key",
    "node",
    "nodes",
    "status",
    "severity",
    "value",
    "step",
    "first_step",
    "description",
    "duration_seconds",
    "duration_steps",
    "last_seen_at",
)


def test_an_alert_written_once_per_chunk_ends_as_one_written_per_finding(make_agent, monkeypatch):
    now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: now)  # last_seen_at comparable across jobs
    deferred, deferred_timeline, writes = evaluated_alert(make_agent, monkeypatch, one_by_one=False)
    reference, reference_timeline, every = evaluated_alert(make_agent, monkeypatch, one_by_one=True)
    assert [getattr(deferred, f) for f in FIELDS] == [getattr(reference, f) for f in FIELDS]
    assert deferred_timeline == reference_timeline
    assert deferred.description == (
        "ranks 0, 1, 2 and 3 more firing; rank 5: guard.skipped_updates 16 is above the threshold 0"
    )
    # Raised, then the five later firings written once, before rank 0's series cleared.
    assert (writes, every) == (2, 6)
