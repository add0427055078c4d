"""The cost of the ranks' agreement per step: ``run.step_boundary`` with the agreement every
step, every 10 steps, and without it, in the same torchrun job (gloo on CPU), in alternating
rounds so the machine's load hits every variant alike. Prints the median per boundary, the
ratio to no agreement, and, for scale, a tiny training step of the same job (an MLP's forward,
backward and gradient all_reduce).

    python bench/ranks_agreement.py [--ranks 2] [--steps 500] [--rounds 7]

No console is needed (the run is offline: the agreement is the same collective either way).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def launch(args: argparse.Namespace) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAKELINE_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "sdk"), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(args.ranks),
        __file__,
        "--worker",
        "--steps",
        str(args.steps),
        "--rounds",
        str(args.rounds),
    ]
    sys.exit(subprocess.call(command, env=env))


def training_step(model, optimizer, inputs, dist) -> None:
    optimizer.zero_grad()
    model(inputs).square().mean().backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()


def worker(args: argparse.Namespace) -> None:
    import logging

    import torch
    import torch.distributed as dist

    import brakeline
    from brakeline._ranksync import RankAgreement

    logging.getLogger("brakeline").setLevel(logging.ERROR)  # "running offline"
    dist.init_process_group("gloo")
    run = brakeline.init(job="bench-agreement", url="", token="", guard=False)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(16, 32)
    variants = {
        "no agreement": RankAgreement("off"),
        "agreement every step": RankAgreement("auto", 1),
        "agreement every 10 steps": RankAgreement("auto", 10),
    }
    timings: dict[str, list[float]] = {name: [] for name in [*variants, "training step"]}
    step = 0
    for _ in range(args.rounds):
        for name, agreement in variants.items():
            run._commands.agreement = agreement
            dist.barrier()
            started = time.perf_counter()
            for _ in range(args.steps):
                step += 1
                run.step_boundary(step)
            timings[name].append((time.perf_counter() - started) / args.steps)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(args.steps // 5):
            training_step(model, optimizer, inputs, dist)
        timings["training step"].append((time.perf_counter() - started) / (args.steps // 5))
    run.finish()
    if dist.get_rank() == 0:
        report(timings, dist.get_world_size(), args)
    dist.destroy_process_group()


def report(timings: dict[str, list[float]], world: int, args: argparse.Namespace) -> None:
    medians = {name: statistics.median(values) for name, values in timings.items()}
    base, step = medians["no agreement"], medians["training step"]
    print(
        f"run.step_boundary, {world} ranks (gloo, CPU), {args.rounds} rounds of "
        f"{args.steps} boundaries, medians per boundary:"
    )
    for name in ("no agreement", "agreement every step", "agreement every 10 steps"):
        value = medians[name]
        print(
            f"  {name:26s} {value * 1e6:9.1f} µs  {value / base:6.1f}x no agreement, "
            f"{(value - base) / step * 100:5.1f} % of a tiny training step"
        )
    print(f"  (tiny training step: MLP forward/backward + gradient all_reduce {step * 1e6:.0f} µs)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    worker(args) if args.worker else launch(args)


if __name__ == "__main__":
    main()
