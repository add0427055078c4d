"""The console goes down for 30 s in the middle of a real training run.

Training must not notice (no stop, no slowdown: logging only queues) and the console must get
every metric point of every step once it is back: the SDK keeps them in memory, spills the
oldest to disk past its (here lowered) memory bound, retries with backoff capped at 1 s, and
replays everything in order. Counted afterwards in PostgreSQL, per metric and per step.

Delivery is at least once: a batch in flight when the console dies may have been stored
although its answer never came, and it is then sent again (the protocol has no batch id for
the console to recognise it). So a step logged in the last instants before the outage may be
stored twice; any other duplicate, and any missing point, fails the test.
"""

from __future__ import annotations

import time

import pytest

from breakers.storage.points import stored_points
from incidents.models import Job, JobStatus
from tests.brakeline.live import points_per_step, wait_for

# The worker evaluates the rules (the default pack reinstalled after earlier flushes).
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("worker"),
]

OUTAGE_SECONDS = 30.0
EXTRA_METRICS = 8  # + loss, grad_norm: ten metrics per step, and the two non-finite counts
METRICS = ["loss", "grad_norm", "nonfinite.loss", "nonfinite.grad"] + [
    f"extra.metric_{index}" for index in range(EXTRA_METRICS)
]


def steps_per_second(training, seconds: float) -> float:
    before, started = training.steps_done(), time.monotonic()
    time.sleep(seconds)
    return (training.steps_done() - before) / (time.monotonic() - started)


def test_an_outage_of_30_seconds_loses_no_point_and_does_not_stop_training(
    restartable_console, agent, training, tmp_path
):
    stop_file = tmp_path / "stop"
    run = training.start(
        "train_torch.py",
        "outage",
        "--steps",
        1_000_000,
        "--step-seconds",
        0.02,
        "--extra-metrics",
        EXTRA_METRICS,
        "--max-memory-points",
        2_000,
        "--stop-file",
        stop_file,
        url=restartable_console.url,
        token=agent.token,
    )
    spill = run.work_dir / "spill" / "outage" / "rank-0"
    wait_for(
        lambda: len(stored_points(agent.job_id)) > 500,
        "the first points to arrive",
        training=run,
    )
    rate_before = steps_per_second(run, 2.0)

    steps_before_stop = run.steps_done()
    restartable_console.stop()
    down_at, steps_at_outage = time.monotonic(), run.steps_done()
    # 30 s at ~12 points per step: several times the lowered memory bound, so it spills.
    wait_for(lambda: list(spill.glob("*.jsonl")), "points spilled to disk", training=run)
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))
    rate_during = (run.steps_done() - steps_at_outage) / (time.monotonic() - down_at)
    stored_during = len(stored_points(agent.job_id))
    restartable_console.start()

    assert run.process.poll() is None, run.tail()
    assert rate_during > 0.75 * rate_before, (rate_during, rate_before)
    wait_for(
        lambda: len(stored_points(agent.job_id)) > stored_during,
        "the replay after the outage",
        training=run,
    )
    time.sleep(2.0)  # a little training after the console is back
    stop_file.touch()
    assert run.wait(timeout=60) == 0, run.tail()

    steps = run.steps_done()
    assert steps > steps_at_outage + OUTAGE_SECONDS * 10
    in_flight = range(steps_before_stop - 50, steps_at_outage + 1)  # logged just before
    for name in METRICS:
        stored = points_per_step(agent.job_id, name)
        assert set(stored) == set(range(1, steps + 1)), f"{name}: points lost"
        twice = {step for step, count in stored.items() if count > 1}
        assert all(stored[step] == 2 and step in in_flight for step in twice), (name, twice)
    assert not list(spill.glob("*.jsonl"))  # everything replayed, nothing left behind
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.FINISHED
