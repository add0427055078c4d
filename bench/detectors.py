"""Throughput of the breaker engine: points per second per core through a JobEvaluator.

Run from the repository root:  python bench/detectors.py [--steps N] [--repeat R]

Each step emits loss, grad_norm, lr and three performance metrics (6 points) through the
default rule pack, and a tick(now) every 100 steps. The baseline is the
same loop building the same points without evaluating them, so the ratio shows what the
evaluation itself costs. Single process, single thread: the figure is per core.

Then the worker's step over one chunk (``breakers.detection.evaluation``: rows as the database
returns them, sorted, the evaluator restored from its JSON state, the chunk evaluated, the
state saved) in CPU µs per point (``time.process_time``), median of ``--rounds`` alternating
rounds: "before", point by point (``JobEvaluator.feed``) with the windows stored as JSON lists
of numbers; point by point with the windows packed (``rolling.pack_floats``); as arrays
(``feed_batch``) with packed windows. One rank (5,000 loss and grad_norm points), and 1,000
ranks with a few points each (5,000 points) and with the chunk the worker reads for a job of
that many series (``batch.chunk_points``), all after the windows have filled.
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

from breakers.detection.batch import CHUNK_POINTS, PointBatch, chunk_points, feed_batch  # noqa: E402
from breakers.detection.engine import JobEvaluator, Point  # noqa: E402
from breakers.detection.rolling import unpack_floats  # noqa: E402
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


def as_lists(state: dict) -> dict:
    """The state with its windows as JSON lists of numbers, as versions 1 and 2 stored them."""
    state = json.loads(json.dumps(state))
    for entry in state["series"]:
        stats = entry["detector"].get("stats")
        if stats:
            stats["values"] = list(unpack_floats(stats["values"]))
            stats["times"] = list(unpack_floats(stats["times"]))
    return state


def worker_step(text: str, rows: list[tuple], mode: str) -> float:
    """CPU seconds of one chunk's evaluation as the worker runs it, from the stored JSON."""
    started = time.process_time()
    rows = sorted(rows, key=lambda row: (row[2], row[0]))
    evaluator = JobEvaluator.from_state(default_rules(), json.loads(text))
    if mode == "arrays":
        feed_batch(evaluator, PointBatch.from_rows(row[1:] for row in rows), lambda f: None)
    else:
        for _, name, step, epoch, value, node, rank in rows:
            evaluator.feed(Point(name, step, epoch, value, node, rank))
    state = evaluator.to_state()
    if mode == "before":
        listed = time.process_time()
        state = as_lists(state)  # not the worker's work: taken out of the figure
        started += time.process_time() - listed
    json.dumps(state, allow_nan=False)
    return time.process_time() - started


MODES = ("before", "points", "arrays")


def warm_state(ranks: int) -> dict:
    """The engine's state once the 500-point windows of every rank are full."""
    warm = JobEvaluator(default_rules())
    for _, name, step, epoch, value, node, rank in worker_rows(ranks, 520, 0, seed=2):
        warm.feed(Point(name, step, epoch, value, node, rank))
    return warm.to_state()


def worker_comparison(state: dict, ranks: int, points: int, rounds: int) -> dict[str, float]:
    """Median CPU µs per point of a chunk of `points` points of `ranks` ranks: point by point
    with the windows stored as lists ("before"), point by point with packed windows, as
    arrays."""
    texts = {"before": json.dumps(as_lists(state))}
    texts["points"] = texts["arrays"] = json.dumps(state)
    rows = worker_rows(ranks, max(1, points // (2 * ranks)), 520, seed=3)
    costs: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            costs[mode].append(worker_step(texts[mode], rows, mode) / len(rows) * 1e6)
    return {mode: statistics.median(values) for mode, values in costs.items()}


def print_worker_comparison(rounds: int) -> None:
    print(
        f"worker step over one chunk (restore, evaluate, save), CPU µs/point, median of {rounds}:"
    )
    print("  ranks  chunk    before  per point  as arrays   before/arrays  per point/arrays")
    for ranks in (1, 1000):
        state = warm_state(ranks)
        sized = chunk_points(len(state["series"]))
        for points in sorted({CHUNK_POINTS, sized}):
            cost = worker_comparison(state, ranks, points, rounds)
            before, each, arrays = (cost[mode] for mode in MODES)
            print(
                f"  {ranks:>5} {points:>6} {before:9.2f} {each:10.2f} {arrays:10.2f} "
                f"{before / arrays:12.2f} × {each / arrays:13.2f} ×"
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
