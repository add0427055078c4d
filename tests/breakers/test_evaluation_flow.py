"""Evaluation through the real stack: HTTP ingest, Redis, a real Celery worker, PostgreSQL.

The worker runs in a thread of this process (``celery_worker`` in tests/conftest.py) and
commits on its own connection, so these tests are transactional, and each waits until the
worker is idle before it ends (the next test's flush must not race a running task).
"""

from __future__ import annotations

import json
import math
import random
import threading
from contextlib import contextmanager

import pytest
from celery.signals import before_task_publish
from django.db import connection, transaction

from breakers.detection import evaluation, tasks
from breakers.models import EvaluationState
from breakers.storage.points import stored_points
from incidents.models import Alert, Incident, TimelineEntry
from tests.support.waiting import wait_for
from tests.support.worker import worker_idle

pytestmark = pytest.mark.django_db(transaction=True)

METRICS = "/api/v1/agent/metrics"


def post_points(client, agent, points) -> None:
    response = client.post(
        METRICS,
        data=json.dumps({"points": points}),
        content_type="application/json",
        headers=agent.headers,
    )
    assert response.status_code == 202, response.content


@contextmanager
def published_evaluations():
    """Counts evaluate_job messages actually sent to the broker."""
    sent = []

    def count(sender=None, **kwargs):
        if sender == tasks.evaluate_job.name:
            sent.append(kwargs["headers"]["id"])

    before_task_publish.connect(count, weak=False)
    try:
        yield sent
    finally:
        before_task_publish.disconnect(count)


def evaluated_everything(job_id: int) -> bool:
    last = sorted((p.id for p in stored_points(job_id)), reverse=True)
    state = EvaluationState.objects.filter(job_id=job_id).first()
    return state is not None and bool(last) and state.cursor == last[0]


def test_a_nan_loss_over_http_yields_an_l3_alert_and_an_incident(client, agent, worker):
    post_points(client, agent, [{"name": "loss", "step": s, "value": 2.0} for s in range(50)])
    post_points(client, agent, [{"name": "loss", "step": 50, "value": "NaN", "node": "node-07"}])
    alert = wait_for(lambda: Alert.objects.filter(job_id=agent.job_id).first(), "the alert")
    assert (alert.severity, alert.status, alert.metric, alert.node) == (
        "L3",
        "firing",
        "loss",
        "node-07",
    )
    assert math.isnan(alert.value) and alert.first_step == 50
    assert alert.action == "checkpoint_and_pause" and alert.runbook_key == "non_finite"
    incident = Incident.objects.get(job_id=agent.job_id)
    assert (incident.status, incident.level) == ("open", "L3")
    rows = TimelineEntry.objects.filter(incident=incident)
    assert [(r.kind, r.step) for r in rows][:2] == [
        ("first_anomalous_point", 50),
        ("alert_raised", 50),
    ]


def test_a_burst_of_100_batches_while_an_evaluation_runs_queues_two_tasks(client, agent, worker):
    EvaluationState.objects.create(job_id=agent.job_id)
    held, release = threading.Event(), threading.Event()

    def hold_evaluation_lock() -> None:
        # A slow evaluation: the worker's task blocks on the job's row until we let go.
        with transaction.atomic():
            EvaluationState.objects.select_for_update().get(job_id=agent.job_id)
            held.set()
            release.wait(30)
        connection.close()

    holder = threading.Thread(target=hold_evaluation_lock)
    holder.start()
    held.wait(10)
    try:
        with published_evaluations() as sent:
            for batch in range(100):
                points = [{"name": "loss", "step": batch * 10 + i, "value": 2.0} for i in range(10)]
                post_points(client, agent, points)
    finally:
        release.set()
        holder.join(10)
    # The first task took the flag off and waits for the lock; the next batch queued one
    # follow-up; the 98 others found it queued.
    assert 1 <= len(sent) <= 3, sent
    wait_for(lambda: evaluated_everything(agent.job_id), "every point to be evaluated")
    assert EvaluationState.objects.get(job_id=agent.job_id).points_evaluated == 1000


def test_points_arriving_during_an_evaluation_get_one_follow_up(client, agent, worker):
    post_points(client, agent, [{"name": "loss", "step": s, "value": 2.0} for s in range(20)])
    wait_for(lambda: evaluated_everything(agent.job_id), "the first evaluation")
    with published_evaluations() as sent:
        post_points(client, agent, [{"name": "loss", "step": 20, "value": "NaN"}])
    assert len(sent) == 1
    wait_for(lambda: Alert.objects.filter(job_id=agent.job_id).exists(), "the alert")


def test_duplicate_deliveries_and_concurrent_workers_raise_one_alert(client, agent, worker):
    # A flag that says "queued" keeps ingest from scheduling: the evaluations below are ours.
    tasks._redis().set(tasks._flag("evaluate", agent.job_id), 1, ex=60)
    post_points(client, agent, [{"name": "loss", "step": s, "value": 2.0} for s in range(500)])
    post_points(client, agent, [{"name": "grad_norm", "step": 500, "value": "Infinity"}])
    EvaluationState.objects.create(job_id=agent.job_id)
    barrier, errors, evaluated = threading.Barrier(3), [], []

    def evaluate() -> None:
        try:
            barrier.wait(10)
            evaluated.append(evaluation.evaluate_job(agent.job_id, chunk_size=100).points)
        except Exception as error:
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=evaluate) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    tasks.evaluate_job.delay(agent.job_id)  # and a redelivered task on the real worker
    evaluated.append(tasks.evaluate_job.apply(args=[agent.job_id]).result)  # once more
    wait_for(worker_idle, "the redelivered task")
    assert errors == []
    assert sum(evaluated) == 501, evaluated  # the lock serialised them: nobody re-read a point
    state = EvaluationState.objects.get(job_id=agent.job_id)
    assert state.points_evaluated == 501  # each point once, whoever evaluated it
    assert Alert.objects.filter(job_id=agent.job_id).count() == 1
    assert TimelineEntry.objects.filter(kind="alert_raised").count() == 1


def test_the_periodic_tick_evaluates_what_a_lost_task_left_behind(client, agent, worker):
    # The flag says "queued" but no task is: as if the broker lost the message.
    tasks._redis().set(tasks._flag("evaluate", agent.job_id), 1, ex=60)
    post_points(client, agent, [{"name": "loss", "step": 1, "value": "NaN"}])
    wait_for(worker_idle, "the worker to settle")  # had a task been sent, it would have run
    assert not Alert.objects.filter(job_id=agent.job_id).exists()
    assert tasks.tick_evaluations.apply().result == 1  # beat: one tick per running job
    wait_for(lambda: Alert.objects.filter(job_id=agent.job_id).exists(), "the alert")
    assert EvaluationState.objects.get(job_id=agent.job_id).last_tick is not None


def post_rank_batch(client, agent, rank, points) -> None:
    body = {"rank": rank, "points": points}
    response = client.post(
        METRICS, data=json.dumps(body), content_type="application/json", headers=agent.headers
    )
    assert response.status_code == 202, response.content


def test_two_ranks_posting_their_own_batches_are_judged_apart(client, agent, worker):
    """Rank 1's loss runs 0.5 above rank 0's (its shard), each rank posts its own batches and
    the worker evaluates each on arrival: pooled, rank 1's first batch read as a jump of 50σ
    over rank 0's window. Per rank nothing fires — until rank 1's loss turns NaN."""
    rng = random.Random(3)
    for rank in (0, 1):
        points = [
            {"name": "loss", "step": s, "value": 2.0 + 0.5 * rank + 0.01 * rng.gauss(0, 1)}
            for s in range(250)
        ]
        post_rank_batch(client, agent, rank, points)
        wait_for(lambda: evaluated_everything(agent.job_id), f"rank {rank}'s batch evaluated")
    assert list(Alert.objects.filter(job_id=agent.job_id).values_list("rule_key")) == []
    post_rank_batch(client, agent, 1, [{"name": "loss", "step": 250, "value": "NaN"}])
    alert = wait_for(lambda: Alert.objects.filter(job_id=agent.job_id).first(), "the alert")
    assert (alert.rule_key, alert.description) == (
        "non-finite-loss-or-gradients",
        "rank 1: loss is NaN at step 250",
    )
    wait_for(lambda: evaluated_everything(agent.job_id), "the NaN evaluated")
    wait_for(worker_idle, "the worker to settle")
    assert Alert.objects.filter(job_id=agent.job_id).count() == 1
