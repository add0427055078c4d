"""A DDP run (gloo, CPU) under torchrun for the whole-job tests: checkpoint sets, resume, roll
back, a hung rank, terminate under a restarting launcher.

Usage: torchrun ... train_ranks.py WORK_DIR [options]. Every rank has its own brakeline run,
appends ``<step> <float.hex(loss)>`` to WORK_DIR/losses-rank<R>.txt and a line
``<rank> <restart count> <pid> trains`` to WORK_DIR/starts.txt once it starts training (a
relaunch the exit protocol stops never writes it). The data is a DistributedSampler shard
without shuffling, so the wrapped loader's position is the whole data state.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import brakeline


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("work", type=Path)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--checkpoint-at", type=int, action="append", default=[])
    parser.add_argument("--resume", action="store_true", help="from the latest complete set")
    parser.add_argument("--roll-back-at", type=int, default=0)
    parser.add_argument("--roll-back-params", type=Path, default=None)
    parser.add_argument("--roll-back-to", type=int, default=0, help="this run's set of step N")
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=0)
    parser.add_argument("--hang-in-work", action="store_true", help="hang before the forward")
    parser.add_argument("--step-seconds", type=float, default=0.0)
    # Each rank's own work before its forward pass (a stand-in for compute: the ranks' gradient
    # all-reduce then waits for the slowest), and more of it on one rank.
    parser.add_argument("--work-seconds", type=float, default=0.0)
    parser.add_argument("--more-work-rank", type=int, default=-1)
    parser.add_argument("--more-work-seconds", type=float, default=0.0)
    parser.add_argument("--losses-suffix", default="")
    parser.add_argument("--dcp", action="store_true", help="torch.distributed.checkpoint saves")
    parser.add_argument("--ddp-option", action="append", default=[], help="NAME=true|false")
    return parser.parse_args()


def dcp_saver(run, model, optimizer, loader, resume: bool) -> None:
    """Each rank's shard is a torch.distributed.checkpoint folder of its own (``no_dist``: the
    rank's own state, no collective inside the save), in the brakeline set of its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    def state():
        model_state, optimizer_state = get_state_dict(model, optimizer)
        # The data position (nested, with RNG tensors) as one bytes object: DCP stores BytesIO.
        data = io.BytesIO()
        torch.save(loader.state_dict(), data)
        return {"model": model_state, "optimizer": optimizer_state, "data": data}

    run.set_saver(lambda path, step: dcp.save(state(), checkpoint_id=path, no_dist=True), ".dcp")
    if resume:
        found = brakeline.latest_set(run.settings.checkpoint_dir, dist.get_rank())
        loaded = {**state(), "data": io.BytesIO()}
        dcp.load(loaded, checkpoint_id=found.shard(dist.get_rank())["path"], no_dist=True)
        loaded["data"].seek(0)
        set_state_dict(
            model, optimizer, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"]
        )
        loader.load_state_dict(torch.load(loaded["data"], weights_only=True))
        run.step = found.step


def roll_back_params(opts: argparse.Namespace, run) -> dict:
    """The console's resume params (a file), or the ones it would send for this run's own
    set of step ``--roll-back-to`` (what its catalogue holds)."""
    if opts.roll_back_params is not None:
        return json.loads(opts.roll_back_params.read_text())
    manifest = brakeline.read_manifest(
        Path(run.settings.checkpoint_dir) / f"step-{opts.roll_back_to:08d}.manifest.json"
    )
    rank0 = manifest.shard(0)
    named = {"manifest": manifest.path, "manifest_sha256": manifest.sha256}
    return {"checkpoint": rank0["path"], "sha256": rank0["sha256"], "set": named}


def own_work(opts: argparse.Namespace, rank: int, step: int) -> None:
    time.sleep(opts.work_seconds + (opts.more_work_seconds if rank == opts.more_work_rank else 0))
    while opts.hang_in_work and rank == opts.hang_rank and step == opts.hang_at:
        # Hung inside the step's work: the other ranks pass the same boundary, then block in
        # this step's gradient all-reduce, which this rank never enters.
        time.sleep(1)


def main() -> None:
    opts = options()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    run = brakeline.init(
        job="ranks",
        spill_dir=str(opts.work / "spill"),
        checkpoint_dir=str(opts.work / "checkpoints"),
        heartbeat_interval=0.1,
        flush_interval=0.05,
        backoff_base=0.05,
        backoff_cap=1.0,
        finish_timeout=20.0,
        send_snapshots=False,
    )
    restarts = os.environ.get("TORCHELASTIC_RESTART_COUNT", "?")
    with open(opts.work / "starts.txt", "a") as starts:
        starts.write(f"{rank} {restarts} {os.getpid()} trains\n")
    model, optimizer, loader = set_up(opts, rank, run)
    with open(opts.work / f"losses-rank{rank}{opts.losses_suffix}.txt", "a", buffering=1) as losses:
        train(opts, rank, run, model, optimizer, loader, losses)
    run.finish()
    leave()


def set_up(opts: argparse.Namespace, rank: int, run: brakeline.Run) -> tuple:
    """The DDP model, its optimizer and the wrapped loader, restored when resuming."""
    torch.manual_seed(1234)
    ddp_options = {k: v == "true" for k, v in (o.split("=") for o in opts.ddp_option)}
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)),
        **ddp_options,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    inputs = torch.randn(512, 8, generator=torch.Generator().manual_seed(7))
    dataset = torch.utils.data.TensorDataset(inputs, inputs[:, :4].sum(dim=1, keepdim=True).sin())
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
    loader = run.wrap_loader(torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler))
    run.watch(model=model, optimizer=optimizer)
    if opts.dcp:
        dcp_saver(run, model, optimizer, loader, opts.resume)
    elif opts.resume:
        path = brakeline.latest_checkpoint(opts.work / "checkpoints", rank=rank)
        if path is None:
            sys.exit(f"rank {rank}: no complete checkpoint set to resume from")
        run.step = brakeline.restore(path, model=model, optimizer=optimizer, loader=loader).step
    return model, optimizer, loader


def train(opts, rank, run, model, optimizer, loader, losses) -> None:
    """Steps until ``opts.steps``, with the hangs, checkpoints and roll back asked for."""
    while run.step < opts.steps:
        for batch, target in loader:
            step = run.step + 1
            own_work(opts, rank, step)
            loss = torch.nn.functional.mse_loss(model(batch), target)
            optimizer.zero_grad()
            loss.backward()  # the gradients' all_reduce: ranks move in lockstep
            optimizer.step()
            run.log({"loss": loss}, step=step)
            losses.write(f"{step} {loss.item().hex()}\n")
            if step in opts.checkpoint_at:
                run.checkpoint(step)  # collective: rank 0 writes the set's manifest
            while not opts.hang_in_work and rank == opts.hang_rank and step == opts.hang_at:
                # Hung before its boundary: no more progress nor heartbeats, while the other
                # ranks pass this step's boundary and block in the next step's all_reduce.
                time.sleep(1)
            if step == opts.roll_back_at and (opts.roll_back_params or opts.roll_back_to):
                opts.roll_back_at = 0  # once
                run.roll_back(roll_back_params(opts, run))
            else:
                run.step_boundary(step)
            if opts.step_seconds:
                time.sleep(opts.step_seconds)
            if run.step >= opts.steps:
                break


def leave() -> None:
    # Every rank done with its collectives before any tears gloo down: a rank destroying its
    # group while the other still had one in flight aborted in gloo's threads ("terminate
    # called without an active exception", SIGABRT) in about half the DCP runs.
    dist.barrier()
    dist.destroy_process_group()
    # Then out without the interpreter's finalisation: rarely (once in several CI runs) a rank
    # still aborted after all of the above (SIGABRT, "terminate called without an active
    # exception"), most likely while the interpreter tore down objects holding gloo work
    # (DDP's reducer; pytorch#179291 describes such an abort). Everything this script writes
    # is closed and the SDK finished above, so nothing is lost by skipping it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
