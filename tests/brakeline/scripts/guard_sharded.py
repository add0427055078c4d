"""The step guard on sharded parameters (torch's fully_shard, gloo, CPU), without a console.

Usage: torchrun --standalone --nproc_per_node 2 guard_sharded.py REPORT_DIR --device-mode M

Each layer of a small model is sharded over the ranks. At step 4, rank 1 alone writes +Inf into
its own shard of the first gradient (after the reduce-scatter: no other rank sees it). Each rank
reports as REPORT_DIR/rank-R.json: the steps whose update its guard refused, whether its shard
of the weights is bit-equal before and after step 4 (and, on the device path, step 5, refused
because the flag is read one step late), the collectives one clean guarded step made, and
whether its weights are finite at the end.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.debug import CommDebugMode

from brakeline._guard import StepGuard

FAULT_STEP = 4
STEPS = 8


def shards(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.to_local().detach().clone() for p in model.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("report", type=Path)
    parser.add_argument("--device-mode", default="auto")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    step = 0
    guard = StepGuard(lambda: step, device_mode=args.device_mode)
    guard.watch_optimizer(optimizer)
    inputs = torch.randn(32, 16, generator=torch.Generator().manual_seed(rank))
    first = next(model.parameters())
    unchanged: dict[int, bool] = {}
    collectives = None
    for step in range(1, STEPS + 1):
        optimizer.zero_grad()
        model(inputs).pow(2).mean().backward()
        if step == FAULT_STEP and rank == 1:
            first.grad.to_local().view(-1)[0] = float("inf")
        before = shards(model)
        if step == 2:
            with CommDebugMode() as comm:
                optimizer.step()
            collectives = comm.get_total_counts()
        else:
            optimizer.step()
        after = shards(model)
        unchanged[step] = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
        guard.take_trip()
    report = {
        "skipped": guard.skipped_updates,
        "unchanged": unchanged,
        "collectives_per_step": collectives,
        "finite": all(bool(torch.isfinite(s).all()) for s in shards(model)),
    }
    (args.report / f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
