"""Data-parallel training (gloo, CPU) under torchrun where one rank's loss turns NaN at one step.

Usage: torchrun --standalone --nproc_per_node N train_rank_sync.py WORK_DIR --nan-at S
       [--nan-rank R] [--no-websocket 1,3] [--jitter SECONDS] [--seed K] [--max-steps M]
       [--slow-poll SECONDS]

The NaN loss of one rank reaches every rank's gradients through the gradients' all_reduce, so every
rank's step guard refuses that update and holds for the console's decision; the console's
rules answer with checkpoint_and_pause, which every rank must apply at the same step. After
the resume every rank stops at once (the same step: it is applied where they hold). Each rank
then writes WORK_DIR/rank-R.json: where it was held, its last step, whether it resumed.
``--jitter``: a random sleep of up to this many seconds per step and rank (seeded), so the
ranks reach each boundary at different moments; ``--no-websocket``: ranks that get commands
only in heartbeat and metrics replies (BRAKELINE_WEBSOCKET=0 for them), every
``--slow-poll`` seconds if given. ``--nan-at 0``: no NaN (the pause comes from a person).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist

import brakeline


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("work", type=Path)
    parser.add_argument("--nan-at", type=int, required=True)
    parser.add_argument("--nan-rank", type=int, default=1)
    parser.add_argument("--no-websocket", default="")
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=3000)
    # Ranks without a websocket ask the console this often (heartbeats, metrics batches), so
    # a command can reach them after the others are at its step (0: the test's 0.2/0.05 s).
    parser.add_argument("--slow-poll", type=float, default=0.0)
    return parser.parse_args()


def average_gradients(model: torch.nn.Module) -> None:
    """All-reduce and average the gradients, as DDP does: the ranks move in lockstep, and one
    rank's NaN reaches every rank's gradients."""
    world = dist.get_world_size()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= world


def main() -> None:
    args = arguments()
    logging.basicConfig(format="%(asctime)s %(process)d %(message)s", level=logging.WARNING)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    logging.getLogger("brakeline").warning("rank %d started", rank)
    without_websocket = {int(r) for r in args.no_websocket.split(",") if r.strip()}
    slow = args.slow_poll if rank in without_websocket else 0.0
    run = brakeline.init(
        job="ranks",
        spill_dir=str(args.work / f"spill-{rank}"),
        checkpoint_dir=str(args.work / "checkpoints"),
        use_websocket=rank not in without_websocket,
        heartbeat_interval=slow or 0.2,
        flush_interval=slow or 0.05,
        backoff_base=0.05,
        backoff_cap=1.0,
        finish_timeout=30.0,
        guard_hold_seconds=60.0,
        send_snapshots=False,
    )
    held: list[int] = []
    resumed: list[int] = []
    run.on_release(lambda info: held.append(info.step))
    run.on_resume(lambda info: resumed.append(info.step))
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    run.watch(model=model, optimizer=optimizer)
    jitter = random.Random(args.seed * 1000 + rank)
    inputs = torch.randn(64, 8, generator=torch.Generator().manual_seed(7 + rank))
    targets = inputs.sum(dim=1, keepdim=True)
    step = 0
    for step in range(1, args.max_steps + 1):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        if step == args.nan_at and rank == args.nan_rank:
            loss = loss * float("nan")  # this rank only; the all_reduce spreads it
        loss.backward()
        average_gradients(model)  # what DDP does, without its seconds-long set-up
        optimizer.step()
        run.log({"loss": loss}, step=step)
        run.step_boundary(step)
        if resumed:
            break  # every rank resumes where they all held: they stop together
        if args.jitter:
            time.sleep(jitter.uniform(0, args.jitter))
    report = {"rank": rank, "held_at": held, "last_step": step, "resumed": resumed}
    (args.work / f"rank-{rank}.json").write_text(json.dumps(report))
    run.finish()
    logging.getLogger("brakeline").warning("rank %d finished", rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
