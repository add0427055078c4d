"""The cost of timing the gradient sync: a DDP step with DDP's built-in all-reduce, and with
the SDK's communication hook (``brakeline._pace``: a note per bucket, then DDP's own
``allreduce_hook``).

    python bench/ddp_sync_timing.py [--ranks 2] [--pairs 8] [--steps 200]

Starts itself under torchrun (gloo, CPU, one intra-op thread). Blocks of --steps steps
alternate, a fresh DDP each, plain then hooked, --pairs times, so both sides of a pair see the
same machine load. A block's figure is its median step time, measured twice: wall clock, and
the training thread's CPU time (what the hook costs in the loop; the figure that stays
readable when other processes load the machine). Printed: the medians over the pairs and
their ratio hooked / plain.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _block(hooked: bool, steps: int) -> tuple[float, float]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from brakeline._pace import StepPace

    net = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 256),
        torch.nn.Tanh(),
        torch.nn.Linear(256, 1),
    )
    model = DistributedDataParallel(net)
    if hooked:
        assert StepPace(lambda: 1).hook(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    wall, cpu = [], []
    for index in range(steps + 20):
        started, started_cpu = time.perf_counter(), time.thread_time()
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if index >= 20:  # DDP's first steps (bucket rebuild) are not the steady state
            wall.append(time.perf_counter() - started)
            cpu.append(time.thread_time() - started_cpu)
    return statistics.median(wall), statistics.median(cpu)


def _rank(pairs: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(pairs):
        for hooked in (False, True):
            results[hooked].append(_block(hooked, steps))
    if dist.get_rank() == 0:
        for what, index in (("wall clock", 0), ("training thread CPU", 1)):
            plain = statistics.median(r[index] for r in results[False])
            hooked = statistics.median(r[index] for r in results[True])
            print(
                f"{what:>20}: plain {plain * 1e6:7.0f} µs, hooked {hooked * 1e6:7.0f} µs, "
                f"ratio {hooked / plain:.3f} ({(hooked - plain) * 1e6:+.0f} µs a step)"
            )
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.as_rank:
        _rank(options.pairs, options.steps)
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT / 'sdk'}"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(options.ranks),
        __file__,
        "--as-rank",
        "--pairs",
        str(options.pairs),
        "--steps",
        str(options.steps),
    ]
    sys.exit(subprocess.run(command, env=env, check=False).returncode)


if __name__ == "__main__":
    main()
