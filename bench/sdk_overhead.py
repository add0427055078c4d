"""SDK overhead: training-step time of a small model with and without the brakeline SDK.

    DATABASE_URL=… REDIS_URL=… python bench/sdk_overhead.py      (torch needed)

An MLP on CPU (a few ms per step) trains in blocks of --steps steps. Blocks alternate: one
without the SDK, one with it (``run.log`` of 10 metrics — the loss and grad-norm tensors, the
lr and seven more — and ``run.step_boundary`` every step), --pairs times, so both sides of a
pair see the same machine load. A block's figure is its median step time; a pair's overhead is
SDK / plain - 1; the result is the median over the pairs (goal: under 2 %). Step time is
measured twice: wall clock (what training feels, including waits for the GIL held by the SDK's
threads) and the training thread's CPU time (what the SDK's calls cost in the loop, and the
figure that stays readable when other processes load the machine).

Scenarios: the console reachable (Daphne on the bench database, as bench/ingest.py sets it
up), the console down (nothing listens: the SDK buffers, retries and spills to disk), and the
console reachable with ``run.watch(model=...)`` as well (NonFiniteCounter gradient hooks).
torch runs with one intra-op thread: on a small shared machine OpenMP's spinning threads make
step times meaningless; the SDK's background threads get the other core, as they would in a
real job whose data-loader and logging threads share the host.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

from _stack import daphne, free_port, set_up_django

import brakeline

METRICS = 10
EXTRA_NAMES = [f"bench.metric_{i}" for i in range(METRICS - 3)]  # + loss, grad_norm, lr


def build(seed: int = 0):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs, labels = torch.randn(64, 256), torch.randint(0, 10, (64,))
    return model, optimizer, inputs, labels


def block(model, optimizer, inputs, labels, steps: int, start: int, run=None):
    """Medians over ``steps`` steps (with the SDK if ``run``), in seconds: wall-clock step,
    training-thread CPU step, and the training-thread CPU of the SDK calls alone."""
    import torch

    wall, cpu, calls = [], [], []
    for step in range(start, start + steps):
        began, began_cpu = time.perf_counter(), time.thread_time()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if run is not None:
            calls_began = time.thread_time()
            metrics = {"loss": loss, "grad_norm": grad_norm, "lr": optimizer.param_groups[0]["lr"]}
            metrics.update({name: step * 0.001 + i for i, name in enumerate(EXTRA_NAMES)})
            run.log(metrics, step=step)
            run.step_boundary(step)
            calls.append(time.thread_time() - calls_began)
        wall.append(time.perf_counter() - began)
        cpu.append(time.thread_time() - began_cpu)
    return statistics.median(wall), statistics.median(cpu), statistics.median(calls or [0.0])


def paired(run_factory: Callable[[], brakeline.Run], watch: bool, pairs: int, steps: int):
    """[(median plain step, median SDK step, median pair ratio) for wall clock and CPU time],
    and the median CPU time of the SDK calls per step."""
    model, optimizer, inputs, labels = build()
    # The watched side trains its own copy: run.watch wraps the optimizer's step (the step
    # guard) and hooks the model, which must not slow the plain side down too.
    watched, watched_optimizer = (build()[:2]) if watch else (model, optimizer)
    run = run_factory()
    if watch:
        run.watch(model=watched, optimizer=watched_optimizer)
    block(watched, watched_optimizer, inputs, labels, steps, 0, run)  # warm-up: caches, HTTP
    sides: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    step = steps
    for pair in range(pairs):
        # Alternate which side goes first, so a drift in machine load favours neither.
        for with_sdk in (False, True) if pair % 2 == 0 else (True, False):
            pair_model, pair_optimizer = (
                (watched, watched_optimizer) if with_sdk else (model, optimizer)
            )
            sides[with_sdk].append(
                block(
                    pair_model,
                    pair_optimizer,
                    inputs,
                    labels,
                    steps,
                    step,
                    run if with_sdk else None,
                )
            )
            step += steps
    run.finish(timeout=5.0)
    for (
        counter
    ) in run._nonfinite.counters:  # a watched model must not keep counting in the next run
        counter.detach()
    result = []
    for measure in (0, 1):
        plain = [pair[measure] for pair in sides[False]]
        sdk = [pair[measure] for pair in sides[True]]
        ratios = [b / a for a, b in zip(plain, sdk, strict=True)]
        result.append((statistics.median(plain), statistics.median(sdk), statistics.median(ratios)))
    return result, statistics.median(pair[2] for pair in sides[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    # ~1 s blocks: the sender thread's work for a block (flushed every second) mostly lands
    # in that block rather than in the plain block after it.
    parser.add_argument("--steps", type=int, default=200, help="steps per block")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    set_up_django()
    from incidents.jobs import create_job

    spill = tempfile.mkdtemp(prefix="brakeline-bench-spill-")
    common = {
        "spill_dir": spill,
        "checkpoint_dir": spill,
        "send_snapshots": False,
        "finish_timeout": 5.0,
    }

    def console_run(url: str) -> Callable[[], brakeline.Run]:
        def make() -> brakeline.Run:
            created = create_job("bench", f"sdk-overhead-{time.time_ns()}")
            return brakeline.init(job=created.job.name, url=url, token=created.raw_token, **common)

        return make

    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    print(
        f"median of {args.pairs} pairs of {args.steps}-step blocks: wall clock | CPU time "
        "of the training thread | CPU time of run.log + run.step_boundary"
    )
    header = f"{'plain ms':>8} {'SDK ms':>8} {'overhead':>9}"
    print(f"{'scenario':<34} {header} | {header} | {'calls µs':>8}")
    with daphne({"BRAKELINE_AGENT_RATE": "1000000/min"}) as url:
        scenarios = [
            ("console reachable, log 10", console_run(url), False),
            (
                "console down, log 10",
                lambda: brakeline.init(job="bench-down", url=down, token="no-console", **common),
                False,
            ),
            ("console reachable, log 10 + watch", console_run(url), True),
        ]
        for name, factory, watch in scenarios:
            measures, calls = paired(factory, watch, args.pairs, args.steps)
            figures = [
                f"{plain * 1e3:>8.3f} {sdk * 1e3:>8.3f} {ratio - 1:>+9.2%}"
                for plain, sdk, ratio in measures
            ]
            print(f"{name:<34} {' | '.join(figures)} | {calls * 1e6:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
