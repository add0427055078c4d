"""The console goes down in the middle of a real training run, for as long as the SDK takes to
spill three times its (here lowered) memory bound to disk.

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

import contextlib
import time
from pathlib import Path

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

MAX_MEMORY_POINTS = 2_000
# The console stays down until this many points are on disk: several times the memory bound,
# a dozen seconds of training on a quiet machine, retried all along at the capped backoff.
SPILLED_POINTS = 3 * MAX_MEMORY_POINTS
EXTRA_METRICS = 8  # + loss, grad_norm: ten metrics per step, and the two non-finite counts
METRICS = ["loss", "grad_norm", "nonfinite.loss", "nonfinite.grad"] + [
    f"extra.metric_{index}" for index in range(EXTRA_METRICS)
]


def steps_per_second(training, seconds: float) -> float:
    before, started = training.steps_done(), time.monotonic()
    time.sleep(seconds)
    return (training.steps_done() - before) / (time.monotonic() - started)


def spilled_points(spill: Path) -> int:
    """Points in the spill's segments (one JSON line each)."""
    count = 0
    for segment in spill.glob("*.jsonl"):
        with contextlib.suppress(FileNotFoundError):  # replayed and removed since the glob
            count += len(segment.read_bytes().splitlines())
    return count


def test_an_outage_that_spills_to_disk_loses_no_point_and_does_not_stop_training(
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
        MAX_MEMORY_POINTS,
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
    wait_for(
        lambda: spilled_points(spill) >= SPILLED_POINTS,
        f"{SPILLED_POINTS} points spilled to disk",
        training=run,
    )
    outage_seconds = time.monotonic() - down_at
    rate_during = (run.steps_done() - steps_at_outage) / outage_seconds
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
    assert steps > steps_at_outage + outage_seconds * 10
    in_flight = range(steps_before_stop - 50, steps_at_outage + 1)  # logged just before
    _every_point_stored_once(agent.job_id, steps, in_flight)
    assert not list(spill.glob("*.jsonl"))  # everything replayed, nothing left behind
    assert Job.objects.get(pk=agent.job_id).status == JobStatus.FINISHED


def _every_point_stored_once(job_id: int, steps: int, in_flight: range) -> None:
    """Every step's point of every metric is stored; twice only for a batch in flight when
    the console went away (sent, stored, unanswered: sent again)."""
    for name in METRICS:
        stored = points_per_step(job_id, name)
        assert set(stored) == set(range(1, steps + 1)), f"{name}: points lost"
        twice = {step for step, count in stored.items() if count > 1}
        assert all(stored[step] == 2 and step in in_flight for step in twice), (name, twice)
