"""A tiny deterministic PyTorch training run with the SDK (CPU), for the integration tests.

An MLP with dropout learns a fixed regression task from a shuffled DataLoader (so the resume
has to rebuild the shuffle order and the dropout RNG). With --nan-at N the loss of step N is
made NaN; like AMP's GradScaler, the loop then skips the optimizer step (the gradients are
non-finite), so the model stays finite and a run braked after the NaN can be resumed and
compared with an uninterrupted one. With --resume-from it restores a brakeline checkpoint
first, in this fresh process.
"""

from __future__ import annotations

import math
import time

import torch
from _common import LossFile, arguments, start_run

import brakeline


def build(seed_of_data: int = 7):
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 32),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 1),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=25, gamma=0.8)
    generator = torch.Generator().manual_seed(seed_of_data)
    inputs = torch.randn(240, 8, generator=generator)
    targets = inputs[:, :4].sum(dim=1, keepdim=True) - inputs[:, 4:].prod(dim=1, keepdim=True)
    dataset = torch.utils.data.TensorDataset(inputs, targets)
    # 15 batches per epoch; shuffle draws from the global torch generator at each epoch.
    loader = torch.utils.data.DataLoader(dataset, batch_size=16, shuffle=True)
    return model, optimizer, scheduler, loader


def main() -> None:
    options = arguments(__doc__.splitlines()[0])
    run = start_run(options)
    run.seed(options.seed)
    model, optimizer, scheduler, loader = build()
    loader = run.wrap_loader(loader)
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    step = 0
    if options.resume_from is not None:
        state = brakeline.restore(
            options.resume_from,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            loader=loader,
            expected_sha256=options.expected_sha256,
        )
        step = state.step
    losses = LossFile(options.losses)
    extra = [f"extra.metric_{index}" for index in range(options.extra_metrics)]
    done = step >= options.steps
    while not done:
        for inputs, targets in loader:
            step += 1
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            if step == options.nan_at:
                loss = loss * math.nan
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            if torch.isfinite(grad_norm):
                optimizer.step()  # a step with non-finite gradients is skipped (GradScaler-like)
            scheduler.step()
            metrics = {"loss": loss, "grad_norm": grad_norm, **{name: step for name in extra}}
            run.log(metrics, step=step)
            losses.write(step, loss.item())
            run.step_boundary(step)
            if options.step_seconds:
                time.sleep(options.step_seconds)
            stop_asked = options.stop_file is not None and options.stop_file.exists()
            done = step >= options.steps or stop_asked
            if done:
                break
    losses.close()
    run.finish()


if __name__ == "__main__":
    main()
