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
``--fault``: what turns non-finite at that step on that rank — its loss (``nan-loss``, the
default), one gradient (``inf-grad``: +Inf in a parameter's gradient before the all-reduce;
under ``--fsdp`` in the rank's own shard of it after the reduce-scatter, where no other rank
sees it) or its input batch (``poisoned-batch``). ``--ddp``: the model in torch's
DistributedDataParallel (its own all-reduce inside backward), ``--fsdp`` in its fully_shard
(each rank keeps a shard, gradients reduce-scattered), instead of the hand-made averaging. Each
rank's report then also says whether the faulty step's update was refused (its weights bit-equal
to those before that step), whether every weight was finite where it held, and the last step
whose update its weights hold.
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
    parser.add_argument("--fault", choices=FAULTS, default="nan-loss")
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--fsdp", action="store_true", help="torch's fully_shard (FSDP2)")
    # The node's forwarder (on local rank 0) stops at this step: its ranks go on directly.
    parser.add_argument("--stop-forwarder-at", type=int, default=0)
    return parser.parse_args()


FAULTS = ("nan-loss", "inf-grad", "poisoned-batch")


def _inf_gradient(grad: torch.Tensor) -> torch.Tensor:
    poisoned = grad.clone()
    poisoned.view(-1)[0] = float("inf")
    return poisoned


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded (FSDP) parameter, or the tensor itself."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class Weights:
    """What the rank's weights hold: the last step whose update changed them, whether the
    faulty step's update was refused, whether they were finite where the rank held."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.last_applied = 0
        self.fault_refused: bool | None = None
        self.finite_at_hold: list[bool] = []

    def snapshot(self) -> list[torch.Tensor]:
        return [_local(p).detach().clone() for p in self.model.parameters()]

    def after_step(self, step: int, before: list[torch.Tensor], faulty: bool) -> None:
        params = self.model.parameters()
        same = all(torch.equal(_local(p), b) for p, b in zip(params, before, strict=True))
        if faulty:
            self.fault_refused = same
        if not same:
            self.last_applied = step

    def held(self) -> None:
        self.finite_at_hold.append(
            all(bool(torch.isfinite(_local(p)).all()) for p in self.model.parameters())
        )


def average_gradients(model: torch.nn.Module) -> None:
    """All-reduce and average the gradients, as DDP does: the ranks move in lockstep, and one
    rank's NaN reaches every rank's gradients."""
    world = dist.get_world_size()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
        parameter.grad /= world


def node_traffic(run: brakeline.Run) -> dict:
    """How this rank's requests went: through its node's forwarder or directly, and (on
    the node's local rank 0) how many bundles its forwarder sent."""
    transport = run.sender.transport if run.sender is not None else None
    forwarder = getattr(run.push, "forwarder", None)
    return {
        "through_node": getattr(transport, "through_node", 0),
        "direct": getattr(transport, "direct_posts", 0),
        "bundles": forwarder.bundles_sent if forwarder is not None else 0,
        "parts": forwarder.parts_sent if forwarder is not None else 0,
    }


def stop_forwarder(run: brakeline.Run) -> None:
    """The forwarder's threads end and its socket goes (its process lives on): what every
    rank of the node meets when a forwarder dies."""
    link = run.push
    if getattr(link, "forwarder", None) is not None:
        if link.node_push is not None:
            link.node_push.stop()
        link.forwarder.stop()
        logging.getLogger("brakeline").warning(
            "rank %d stopped its node's forwarder", run.settings.rank
        )


def start_run(args: argparse.Namespace, rank: int) -> brakeline.Run:
    without_websocket = {int(r) for r in args.no_websocket.split(",") if r.strip()}
    slow = args.slow_poll if rank in without_websocket else 0.0
    return brakeline.init(
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


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    if args.ddp:
        return torch.nn.parallel.DistributedDataParallel(model)
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
    return model


def backward(args, model, inputs, targets, step: int, rank: int) -> torch.Tensor:
    """The step's loss, its gradients computed: with the fault, at its step on its rank only
    (the all-reduce spreads it)."""
    here = step == args.nan_at and rank == args.nan_rank
    first = next(model.parameters())
    batch = inputs
    if here and args.fault == "poisoned-batch":
        batch = inputs.clone()
        batch[0, 0] = float("nan")
    inf_grad = here and args.fault == "inf-grad"
    hook = first.register_hook(_inf_gradient) if inf_grad and not args.fsdp else None
    loss = torch.nn.functional.mse_loss(model(batch), targets)
    if here and args.fault == "nan-loss":
        loss = loss * float("nan")
    loss.backward()
    if hook is not None:
        hook.remove()
    if inf_grad and args.fsdp:  # in this rank's shard only, after the reduce-scatter
        _local(first.grad).view(-1)[0] = float("inf")
    if not (args.ddp or args.fsdp):
        average_gradients(model)  # what DDP does, without its seconds-long set-up
    return loss


def main() -> None:
    args = arguments()
    logging.basicConfig(format="%(asctime)s %(process)d %(message)s", level=logging.WARNING)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    logging.getLogger("brakeline").warning("rank %d started", rank)
    run = start_run(args, rank)
    held: list[int] = []
    resumed: list[int] = []
    model = build_model(args)
    weights = Weights(model)
    run.on_release(lambda info: (held.append(info.step), weights.held()))
    run.on_resume(lambda info: resumed.append(info.step))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    run.watch(model=model, optimizer=optimizer)
    jitter = random.Random(args.seed * 1000 + rank)
    inputs = torch.randn(64, 8, generator=torch.Generator().manual_seed(7 + rank))
    targets = inputs.sum(dim=1, keepdim=True)
    step = 0
    for step in range(1, args.max_steps + 1):
        before = weights.snapshot()
        optimizer.zero_grad()
        loss = backward(args, model, inputs, targets, step, rank)
        optimizer.step()
        weights.after_step(step, before, step == args.nan_at)
        run.log({"loss": loss}, step=step)
        if step == args.stop_forwarder_at:
            stop_forwarder(run)
        run.step_boundary(step)
        if resumed:
            break  # every rank resumes where they all held: they stop together
        if args.jitter:
            time.sleep(jitter.uniform(0, args.jitter))
    report = {
        "rank": rank,
        "held_at": held,
        "last_step": step,
        "resumed": resumed,
        "fault_refused": weights.fault_refused,
        "finite_at_hold": weights.finite_at_hold,
        "last_applied": weights.last_applied,
        "node": node_traffic(run),
    }
    (args.work / f"rank-{rank}.json").write_text(json.dumps(report))
    run.finish()
    logging.getLogger("brakeline").warning("rank %d finished", rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
