"""A tiny DDP run (gloo, CPU) under torchrun, every rank with its own brakeline run.

Usage: torchrun --standalone --nproc_per_node N train_ddp.py WORK_DIR STEPS. Each rank
trains STEPS steps of an MLP on its DistributedSampler shard, logging and heartbeating; then
rank 0 finishes its run at once, and every other rank only once WORK_DIR/go exists, so a test
sees the job between the first rank's "finished" and the last one's.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import brakeline


def main() -> None:
    work, steps = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = brakeline.init(
        job="ddp",
        spill_dir=str(work / "spill"),
        checkpoint_dir=str(work / "checkpoints"),
        heartbeat_interval=0.1,
        flush_interval=0.05,
        backoff_base=0.05,
        backoff_cap=1.0,
        finish_timeout=30.0,
    )
    torch.manual_seed(1234)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(256, 8, generator=torch.Generator().manual_seed(7))
    dataset = torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
    step = 0
    while step < steps:
        for batch, target in loader:
            step += 1
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch), target)
            loss.backward()  # the all_reduce of the gradients: ranks move in lockstep
            optimizer.step()
            run.log({"loss": loss}, step=step)
            run.step_boundary(step)
            time.sleep(0.02)  # a few heartbeats' worth of steps
            if step >= steps:
                break
    while rank != 0 and not (work / "go").exists():
        time.sleep(0.05)
    run.finish()


if __name__ == "__main__":
    main()
