"""The evaluation service on PostgreSQL: cursor, exactly-once alerts, incidents and timelines."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from breakers.agent.protocol import PointIn
from breakers.agent.store import store_points
from breakers.detection import batch, evaluation
from breakers.detection.evaluation import evaluate_job
from breakers.models import EvaluationState, Rule
from breakers.storage.points import stored_points
from incidents.models import Alert, Incident, Job, TimelineEntry
from tests.breakers.test_rulepack_scenarios import DIVERGE_AT, NAN_AT, RAMP_AT, diverging_loss

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def store(job_id, points):
    """Store (name, step, value[, node]) tuples as one batch; point time = T0 + step seconds."""
    rows = [
        PointIn(p[0], p[1], p[2], T0 + timedelta(seconds=p[1]), p[3] if len(p) > 3 else None)
        for p in points
    ]
    store_points(job_id, rows)


def losses(steps, value=2.0):
    return [("loss", step, value) for step in steps]


def kinds(incident):
    """The alert and incident rows (the control plane's braking adds command rows of its own)."""
    rows = TimelineEntry.objects.filter(incident=incident).exclude(kind__startswith="command_")
    return list(rows.values_list("kind", flat=True))


class Crash(Exception):
    pass


def test_the_cursor_advances_over_every_point_once(agent):
    store(agent.job_id, losses(range(0, 30)))
    store(agent.job_id, losses(range(30, 50)))
    report = evaluate_job(agent.job_id, chunk_size=7)  # several transactions
    last_id = max(p.id for p in stored_points(agent.job_id))
    assert (report.points, report.cursor) == (50, last_id)
    state = EvaluationState.objects.get(job_id=agent.job_id)
    assert (state.cursor, state.points_evaluated) == (last_id, 50)
    assert state.state["series"] and state.rules_fingerprint
    assert evaluate_job(agent.job_id).points == 0
    store(agent.job_id, losses(range(50, 55)))
    assert evaluate_job(agent.job_id).points == 5


def test_a_nan_loss_raises_an_l3_alert_and_opens_an_incident_with_its_timeline(agent):
    store(agent.job_id, losses(range(0, 100)))
    store(agent.job_id, [("loss", 100, math.nan, "node-07")])
    report = evaluate_job(agent.job_id)
    assert (report.raised, report.resolved) == (1, 0)
    alert = Alert.objects.get(job_id=agent.job_id)
    assert (alert.severity, alert.status, alert.rule_key) == (
        "L3",
        "firing",
        "non-finite-loss-or-gradients",
    )
    assert alert.metric == "loss" and math.isnan(alert.value) and alert.node == "node-07"
    assert (alert.first_step, alert.first_time) == (100, T0 + timedelta(seconds=100))
    assert alert.action == "checkpoint_and_pause" and alert.runbook_key == "non_finite"
    incident = Incident.objects.get(job_id=agent.job_id)
    assert (incident.status, incident.level, incident.first_step) == ("open", "L3", 100)
    assert kinds(incident) == ["first_anomalous_point", "alert_raised"]
    first = TimelineEntry.objects.filter(incident=incident).first()
    assert (first.at, first.step) == (T0 + timedelta(seconds=100), 100)


def test_evaluating_again_or_after_a_crash_never_doubles_an_alert(agent):
    store(agent.job_id, losses(range(0, 10)) + [("loss", 10, math.nan)])
    with pytest.raises(Crash), transaction.atomic():
        evaluate_job(agent.job_id)
        assert Alert.objects.count() == 1
        raise Crash  # the worker died before commit: alert, cursor and state roll back together
    assert not Alert.objects.exists()
    assert not EvaluationState.objects.filter(job_id=agent.job_id, cursor__gt=0).exists()
    evaluate_job(agent.job_id)
    evaluate_job(agent.job_id)  # a duplicate delivery
    assert Alert.objects.count() == 1 and Incident.objects.count() == 1
    assert TimelineEntry.objects.filter(kind="alert_raised").count() == 1


def test_the_alert_resolves_when_the_condition_clears_with_hysteresis(agent):
    store(agent.job_id, losses(range(0, 10)) + [("loss", 10, math.nan)])
    evaluate_job(agent.job_id)
    store(agent.job_id, losses(range(11, 20)))  # 9 finite points: clear_after is 10
    evaluate_job(agent.job_id)
    alert = Alert.objects.get()
    assert alert.status == "firing"
    store(agent.job_id, losses(range(20, 21)))
    assert evaluate_job(agent.job_id).resolved == 1
    alert.refresh_from_db()
    assert alert.status == "resolved" and alert.resolved_at is not None
    assert kinds(alert.incident) == [
        "first_anomalous_point",
        "alert_raised",
        "alert_resolved",
    ]
    # The alert cleared on points already in flight, but its brake (checkpoint_and_pause) was
    # issued: the episode, and so the incident, lasts until the job is resumed healthy or ends.
    assert Incident.objects.get().status == "open"


def test_a_rule_over_two_metrics_resolves_only_when_both_clear(agent):
    store(agent.job_id, [("loss", 1, math.nan), ("grad_norm", 1, math.inf)])
    evaluate_job(agent.job_id)
    assert Alert.objects.count() == 1  # one fingerprint: (job, rule, node)
    store(agent.job_id, losses(range(2, 20)) + [("grad_norm", 2, math.inf)])
    evaluate_job(agent.job_id)
    assert Alert.objects.get().status == "firing"  # loss cleared, grad_norm still fires
    store(agent.job_id, [("grad_norm", step, 1.0) for step in range(3, 15)])
    evaluate_job(agent.job_id)
    assert Alert.objects.get().status == "resolved"


def test_a_divergence_escalates_the_incident_l1_then_l2_then_l3(agent):
    loss_at = diverging_loss(random.Random(5))
    rng = random.Random(99)
    steps = list(range(NAN_AT + 20))
    for start in range(0, len(steps), 1000):  # ten batches, state persisted in between
        batch = []
        for step in steps[start : start + 1000]:
            batch += [("loss", step, loss_at(step)), ("grad_norm", step, abs(rng.gauss(1, 0.2)))]
        store(agent.job_id, batch)
        evaluate_job(agent.job_id)
    incident = Incident.objects.get(job_id=agent.job_id)
    assert incident.level == "L3"
    assert DIVERGE_AT - 3 <= incident.first_step <= DIVERGE_AT
    changes = TimelineEntry.objects.filter(incident=incident, kind="severity_changed")
    assert [(c.data["incident"]["from"], c.data["incident"]["to"]) for c in changes] == [
        ("L1", "L2"),
        ("L2", "L3"),
    ]
    raised = Alert.objects.filter(job_id=agent.job_id).order_by("raised_at", "id")
    assert {a.incident_id for a in raised} == {incident.pk}
    first_of_each = {}
    for alert in raised:  # the L1 notice may fire again during the ramp
        first_of_each.setdefault(alert.rule_key, alert)
    raised = list(first_of_each.values())
    assert [(a.rule_key, a.severity) for a in raised] == [
        ("loss-deviation", "L1"),
        ("loss-sustained-deviation", "L2"),
        ("loss-rising", "L3"),
        ("non-finite-loss-or-gradients", "L3"),
    ]
    assert raised[2].first_step >= RAMP_AT and raised[3].first_step == NAN_AT


def test_node_failures_fire_l4_and_clear_on_a_tick(agent):
    store(agent.job_id, [("node.failure", 10, 1.0, "node-3"), ("node.failure", 20, 1.0, "node-9")])
    evaluate_job(agent.job_id)
    alert = Alert.objects.get()
    assert (alert.severity, alert.action, alert.nodes) == (
        "L4",
        "terminate_and_isolate",
        ["node-3", "node-9"],
    )
    assert alert.node == ""  # the rule pools nodes: one alert for the job
    quiet = (T0 + timedelta(seconds=10 + 61)).timestamp()
    assert evaluate_job(agent.job_id, tick_at=quiet).resolved == 1
    assert Alert.objects.get().status == "resolved"


def test_disabling_a_rule_resolves_its_firing_alert(agent):
    store(agent.job_id, [("loss", 1, math.nan)])
    evaluate_job(agent.job_id)
    team_id = Job.objects.get(pk=agent.job_id).team_id
    row = Rule.objects.get(team=None, key="non-finite-loss-or-gradients")
    row.pk, row.team_id, row.enabled = None, team_id, False
    row.save()
    store(agent.job_id, [("loss", 2, math.nan)])
    assert evaluate_job(agent.job_id).resolved == 1
    alert = Alert.objects.get()
    assert alert.status == "resolved"
    entry = TimelineEntry.objects.get(kind="alert_resolved")
    assert "rule was removed or disabled" in entry.message


def test_the_control_plane_hook_is_called_once_per_new_or_escalated_alert(agent, monkeypatch):
    calls = []
    monkeypatch.setattr(evaluation, "on_alert_raised", calls.append)
    store(agent.job_id, [("loss", 1, math.nan), ("grad_norm", 1, math.nan)])
    store(agent.job_id, [("throughput", s, 1000.0) for s in range(3)])
    evaluate_job(agent.job_id)
    evaluate_job(agent.job_id)
    assert [(o.alert.rule_key, o.created) for o in calls] == [
        ("non-finite-loss-or-gradients", True)
    ]


def test_a_deleted_job_is_nothing_to_evaluate():
    assert evaluate_job(987_654).points == 0


def test_points_are_read_back_with_epoch_times_and_non_finite_values_intact(agent):
    """The evaluator's own read (plain SQL, times as epoch seconds) gives what was stored, a
    block (one per rank and node of a batch) whole, in id order."""
    store(agent.job_id, [("loss", 3, math.nan, "n1"), ("loss", 1, math.inf), ("gn", 2, -math.inf)])
    first = min(p.id for p in stored_points(agent.job_id))
    rows, more = evaluation.read_points(agent.job_id, first - 1, 10)
    assert not more
    by_point = {(r[1], r[2], r[5]): r for r in rows}
    assert sorted(by_point) == [("gn", 2, None), ("loss", 1, None), ("loss", 3, "n1")]
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    for (_, step, _), row in by_point.items():
        assert row[3] == (T0 + timedelta(seconds=step)).timestamp()
    assert math.isnan(by_point[("loss", 3, "n1")][4])
    assert by_point[("loss", 1, None)][4] == math.inf
    assert by_point[("gn", 2, None)][4] == -math.inf
    # Node n1's block, then the other's: a chunk of one point still reads a block whole.
    n1 = by_point[("loss", 3, "n1")][0]
    rest, more = evaluation.read_points(agent.job_id, n1, 1)
    assert sorted((r[1], r[2]) for r in rest) == [("gn", 2), ("loss", 1)] and not more
    assert {r[0] for r in rest} == {by_point[("gn", 2, None)][0]} != {n1}


def store_ranks(job_id, rank, points):
    """Like ``store``, as one rank's batch."""
    rows = [PointIn(n, s, v, T0 + timedelta(seconds=s), None, rank) for n, s, v in points]
    store_points(job_id, rows)


def test_two_ranks_of_one_alert_are_named_and_resolve_only_when_both_clear(agent):
    for rank in (0, 1):
        store_ranks(agent.job_id, rank, losses(range(10), 2.0 + rank))
    store_ranks(agent.job_id, 1, [("loss", 10, math.nan)])
    assert evaluate_job(agent.job_id).raised == 1
    alert = Alert.objects.get()
    assert alert.description == "rank 1: loss is NaN at step 10"
    store_ranks(agent.job_id, 0, [("loss", 11, math.nan)])
    evaluate_job(agent.job_id)
    alert = Alert.objects.get()  # one fingerprint (job, rule, node) for both ranks
    assert alert.description == "ranks 0, 1 firing; rank 0: loss is NaN at step 11"
    store_ranks(agent.job_id, 0, losses(range(12, 30)))
    evaluate_job(agent.job_id, chunk_size=7)  # several transactions: `open` is restored
    alert.refresh_from_db()
    assert alert.status == "firing"  # rank 0 cleared, rank 1 still fires
    store_ranks(agent.job_id, 1, losses(range(11, 21), 3.0))
    assert evaluate_job(agent.job_id).resolved == 1
    alert.refresh_from_db()
    assert alert.status == "resolved"
    entry = TimelineEntry.objects.get(kind="alert_resolved")
    assert "rank 1: loss back to normal" in entry.message


def as_version_1(state: dict) -> dict:
    series = [{k: v for k, v in entry.items() if k != "rank"} for entry in state["series"]]
    return {"version": 1, "series": series}


def test_a_state_stored_before_ranks_resumes_its_open_episodes(agent):
    store(agent.job_id, losses(range(10)) + [("loss", 10, math.nan)])
    evaluate_job(agent.job_id)
    state = EvaluationState.objects.get(job_id=agent.job_id)
    state.state = as_version_1(state.state)
    state.save()
    store(agent.job_id, losses(range(11, 21)))
    # Read as rank 0's series, the open NaN episode clears: a fresh start would never clear it.
    assert evaluate_job(agent.job_id).resolved == 1
    assert EvaluationState.objects.get(job_id=agent.job_id).state["version"] == 3


def test_an_unreadable_state_restarts_the_evaluation_instead_of_failing(agent, caplog):
    store(agent.job_id, losses(range(10)))
    evaluate_job(agent.job_id)
    EvaluationState.objects.filter(job_id=agent.job_id).update(
        state={"version": 1, "series": [{"rule": "loss-deviation"}]}
    )
    store(agent.job_id, [("loss", 10, math.nan)])
    assert evaluate_job(agent.job_id).raised == 1
    assert "unreadable, restarting it" in caplog.text
    assert not Alert.objects.filter(rule_key=evaluation.BREAKERS_FAILING_RULE).exists()


def test_a_chunk_gives_every_stored_series_its_points(agent, monkeypatch):
    """The engine's state (every series' windows) is restored and saved once per chunk: a
    job with many series reads POINTS_PER_SERIES points per stored series at a time, not a
    fixed count, so that round trip is shared by many points."""
    monkeypatch.setattr(batch, "CHUNK_POINTS", 10)
    limits = []
    read = evaluation.read_points

    def reading(job_id, after_id, limit):
        limits.append(limit)
        return read(job_id, after_id, limit)

    monkeypatch.setattr(evaluation, "read_points", reading)
    for first in range(0, 200, 10):
        for rank in (0, 1):
            store_ranks(agent.job_id, rank, losses(range(first, first + 10)))
    assert evaluate_job(agent.job_id).points == 400
    series = len(EvaluationState.objects.get(job_id=agent.job_id).state["series"])
    assert limits[0] == 10  # no state yet
    assert max(limits) == batch.POINTS_PER_SERIES * series > 10
    assert len(limits) < 400 // 10
