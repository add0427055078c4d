"""Throughput of the breaker engine: points per second per core through a JobEvaluator.

Run from the repository root:  python bench/detectors.py [--steps N] [--repeat R]

Each step emits loss, grad_norm, lr and three performance metrics (6 points) through the
default rule pack, and a tick(now) every 100 steps. The baseline is the
same loop building the same points without evaluating them, so the ratio shows what the
evaluation itself costs. Single process, single thread: the figure is per core.

Then the worker's step over one chunk (``breakers.detection.evaluation``: rows as the database
returns them, sorted, the evaluator restored from its JSON state, the chunk evaluated, the
state saved), point by point (``JobEvaluator.feed``) against as arrays (``feed_batch``), in
CPU µs per point (``time.process_time``), median of ``--rounds`` alternating rounds: one rank
(5,000 loss and grad_norm points), and 1,000 ranks with a few points each, both after the
windows have filled.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from breakers.detection.batch import PointBatch, feed_batch  # noqa: E402
from breakers.detection.engine import JobEvaluator, Point  # noqa: E402
from breakers.detection.rulepack import default_rules  # noqa: E402

T0 = 1_767_225_600.0
POINTS_PER_STEP = 6


def make_series(steps: int, seed: int = 1) -> list[tuple[float, ...]]:
    """Pre-computed per-step values, so random-number generation is not what we time."""
    rng = random.Random(seed)
    rows = []
    for step in range(steps):
        loss = (2.0 + 8.0 * math.exp(-step / 20_000)) * (1.0 + 0.03 * rng.gauss(0, 1))
        rows.append(
            (
                loss,
                abs(rng.gauss(1.0, 0.2)),
                3e-4,
                1000 + rng.gauss(0, 10),
                0.93 + rng.gauss(0, 0.01),
                0.05 + abs(rng.gauss(0, 0.005)),
            )
        )
    return rows


def run_loop(
    rows: list[tuple[float, ...]], sink: Callable[[Point], object], tick: Callable[[float], object]
) -> int:
    """The measured loop: build every point and hand it to `sink`; returns points built."""
    count = 0
    for step, (loss, grad, lr, throughput, util, wait) in enumerate(rows):
        now = T0 + step
        sink(Point("loss", step, now, loss))
        sink(Point("grad_norm", step, now, grad))
        sink(Point("lr", step, now, lr))
        sink(Point("throughput", step, now, throughput))
        sink(Point("gpu.0.util", step, now, util, "node-0"))
        sink(Point("perf.data_wait", step, now, wait))
        count += POINTS_PER_STEP
        if step % 100 == 0:
            tick(now + 0.5)
    return count


def time_once(rows: list[tuple[float, ...]], evaluate: bool) -> tuple[float, int]:
    if evaluate:
        evaluator = JobEvaluator(default_rules())
        sink, tick = evaluator.feed, evaluator.tick
    else:

        def sink(point: Point) -> None:
            return None

        def tick(now: float) -> None:
            return None

    start = time.perf_counter()
    count = run_loop(rows, sink, tick)
    return time.perf_counter() - start, count


def median_rate(rows: list[tuple[float, ...]], evaluate: bool, repeat: int) -> float:
    rates = []
    for _ in range(repeat):
        seconds, count = time_once(rows, evaluate)
        rates.append(count / seconds)
    return statistics.median(rates)


def state_figures(rows: list[tuple[float, ...]]) -> tuple[int, float, float]:
    """Size of the serialised evaluator state and the time to save and restore it."""
    evaluator = JobEvaluator(default_rules())
    run_loop(rows, evaluator.feed, evaluator.tick)
    start = time.perf_counter()
    text = json.dumps(evaluator.to_state(), allow_nan=False)
    saved = time.perf_counter() - start
    start = time.perf_counter()
    JobEvaluator.from_state(default_rules(), json.loads(text))
    return len(text), saved, time.perf_counter() - start


CHUNK_POINTS = 5_000  # breakers.detection.evaluation.CHUNK_POINTS


def worker_rows(ranks: int, steps: int, first: int, seed: int) -> list[tuple]:
    """(id, name, step, time, value, node, rank) rows as read_points returns them."""
    rng = random.Random(seed)
    rows: list[tuple] = []
    for step in range(first, first + steps):
        for rank in range(ranks):
            loss = (2.0 + 0.1 * rank) * (1.0 + 0.03 * rng.gauss(0, 1))
            for name, value in (("loss", loss), ("grad_norm", abs(rng.gauss(1.0, 0.2)))):
                rows.append((len(rows), name, step, T0 + step, value, f"node-{rank // 8}", rank))
    return rows


def worker_step(state: dict, rows: list[tuple], batched: bool) -> float:
    """CPU seconds of one chunk's evaluation as the worker runs it."""
    started = time.process_time()
    rows = sorted(rows, key=lambda row: (row[2], row[0]))
    evaluator = JobEvaluator.from_state(default_rules(), json.loads(json.dumps(state)))
    if batched:
        feed_batch(evaluator, PointBatch.from_rows(row[1:] for row in rows), lambda f: None)
    else:
        for _, name, step, epoch, value, node, rank in rows:
            evaluator.feed(Point(name, step, epoch, value, node, rank))
    json.dumps(evaluator.to_state(), allow_nan=False)
    return time.process_time() - started


def worker_comparison(ranks: int, rounds: int) -> tuple[float, float]:
    """Median CPU µs per point of a chunk, point by point and as arrays, for `ranks` ranks."""
    warm = JobEvaluator(default_rules())
    for _, name, step, epoch, value, node, rank in worker_rows(ranks, 520, 0, seed=2):
        warm.feed(Point(name, step, epoch, value, node, rank))  # the 500-point windows full
    state = warm.to_state()
    steps = max(1, CHUNK_POINTS // (2 * ranks))
    rows = worker_rows(ranks, steps, 520, seed=3)
    costs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for batched in (False, True):
            costs[batched].append(worker_step(state, rows, batched) / len(rows) * 1e6)
    return statistics.median(costs[False]), statistics.median(costs[True])


def print_worker_comparison(rounds: int) -> None:
    print(f"worker step over one chunk (restore, evaluate, save), CPU, median of {rounds}:")
    for ranks in (1, 1000):
        old, new = worker_comparison(ranks, rounds)
        print(
            f"  {ranks:>5} rank(s): per point {old:6.2f} µs/point, as arrays {new:6.2f} "
            f"µs/point, ratio {old / new:4.2f} ×"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7, help="worker-step rounds")
    args = parser.parse_args()
    rows = make_series(args.steps)
    baseline = median_rate(rows, evaluate=False, repeat=args.repeat)
    engine = median_rate(rows, evaluate=True, repeat=args.repeat)
    size, saved, restored = state_figures(rows)
    rules = [rule for rule in default_rules() if rule.enabled]
    print(
        f"Python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} logical CPUs; single thread"
    )
    print(
        f"default pack: {len(rules)} enabled rules; {args.steps} steps × "
        f"{POINTS_PER_STEP} points; median of {args.repeat}"
    )
    print(f"  baseline (build points only): {baseline:>12,.0f} points/s")
    print(f"  JobEvaluator.feed:            {engine:>12,.0f} points/s per core")
    print(f"  ratio baseline / evaluator:   {baseline / engine:>12.1f} ×")
    print(f"  evaluation cost:              {1e6 / engine - 1e6 / baseline:>12.2f} µs/point")
    print(
        f"  state: {size / 1024:,.0f} KiB JSON; save {saved * 1e3:.1f} ms, "
        f"restore {restored * 1e3:.1f} ms"
    )
    print_worker_comparison(args.rounds)


if __name__ == "__main__":
    main()
