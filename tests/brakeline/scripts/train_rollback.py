"""A poisoned batch, braked and rolled back: the loop docs/sdk.md recommends for roll back.

An MLP (no dropout) learns a regression task from a shuffled DataLoader. --poison-at S makes
the inputs of step S's batch NaN (a real poisoned batch: loss and gradients are NaN); the SDK's
step guard keeps that update out of the weights. --skip-step S is the reference: the same run
that drops the batch of step S without training on it. The loop takes its step from the run
(``step = run.step + 1``), so a roll back in place moves it with the restored checkpoint.

--closure steps the optimizer with PyTorch's closure (``optimizer.step(closure)``), and
--rerun lets the SDK re-run a refused step's closure to attribute it (docs/sdk.md "Re-run to
attribute"). --flip-at S corrupts one gradient of step S once, on its way (a NaN written by a
hook the first time the gradient is computed): a transient fault, where --poison-at is data.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
from _common import LossFile, start_run


def build():
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.7)
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(320, 8, generator=generator)
    targets = inputs[:, :4].sum(dim=1, keepdim=True).sin()
    dataset = torch.utils.data.TensorDataset(inputs, targets)
    return model, optimizer, scheduler, torch.utils.data.DataLoader(dataset, 16, shuffle=True)


def train_step(model, optimizer, inputs, targets, closure: bool):
    """One optimizer step; with ``closure``, PyTorch's closure convention."""

    def evaluate():
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        return loss

    if closure:
        return optimizer.step(evaluate)
    loss = evaluate()
    optimizer.step()
    return loss


def flip_once(parameter) -> None:
    """The next gradient of ``parameter`` arrives with a NaN in it, once (a bit flipped on the
    device, say); computed again, it is what it should be."""

    def corrupt(grad):
        handle.remove()
        grad = grad.clone()
        grad.view(-1)[0] = math.nan
        return grad

    handle = parameter.register_hook(corrupt)


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="rollback")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--losses", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    parser.add_argument("--poison-at", type=int, action="append", default=[])
    parser.add_argument("--skip-step", type=int, default=0)
    parser.add_argument("--no-guard", action="store_true")
    parser.add_argument("--closure", action="store_true")
    parser.add_argument("--rerun", action="store_true")
    parser.add_argument("--flip-at", type=int, action="append", default=[])
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--backoff-cap", type=float, default=1.0)
    parser.add_argument("--max-memory-points", type=int, default=50_000)
    parsed = parser.parse_args()
    parsed.work_dir, parsed.losses = Path(parsed.work_dir), Path(parsed.losses)
    return parsed


def main() -> None:
    opts = options()
    run = start_run(opts, guard=not opts.no_guard, rerun_nonfinite=opts.rerun)
    run.seed(opts.seed)
    model, optimizer, scheduler, loader = build()
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    losses = LossFile(opts.losses)
    poisoned, flips = set(opts.poison_at), set(opts.flip_at)
    wrapped = run.wrap_loader(loader)
    while run.step < opts.steps:
        for inputs, targets in wrapped:  # one epoch; a roll back re-seeks inside it
            step = run.step + 1
            if step == opts.skip_step:
                run.step_boundary(step)  # the reference: this batch is never trained on
                continue
            if step in poisoned:
                poisoned.discard(step)  # a batch is poisoned once: after a roll back it is not
                inputs = inputs * math.nan
            if step in flips:
                flips.discard(step)
                flip_once(model[0].weight)
            loss = train_step(model, optimizer, inputs, targets, opts.closure)
            scheduler.step()
            run.log({"loss": loss}, step=step)
            losses.write(step, loss.item())
            if opts.checkpoint_every and step % opts.checkpoint_every == 0:
                run.checkpoint(step)
            run.step_boundary(step)
            if opts.step_seconds:
                time.sleep(opts.step_seconds)
            if run.step >= opts.steps:
                break
    losses.close()
    run.finish()
    sys.exit(0)


if __name__ == "__main__":
    main()
