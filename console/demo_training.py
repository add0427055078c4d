"""The demo's training job: a real tiny PyTorch run (CPU) with the brakeline SDK that diverges
on purpose and gets braked by the console.

``manage.py demo`` starts it as a subprocess (``python -P console/demo_training.py ...``; it
needs torch, and imports neither Django nor the console). The run is what a training engineer
writes: ``brakeline.init``, ``run.watch``, ``run.wrap_loader``, ``run.log`` and
``run.step_boundary`` around an ordinary loop.

The story: an MLP learns a noisy regression task, its loss falling (20 steps a second, so the
charts are worth watching), with a checkpoint every CHECKPOINT_EVERY steps. At --diverge-at a
"bad learning-rate schedule" multiplies the learning rate by 1.08 every step: the loss climbs,
then the gradients overflow to Inf and the loss to NaN. The console's L3 rule issues
checkpoint_and_pause; the SDK stops at the step boundary, saves, acknowledges and holds,
heartbeating as paused. Resumed from the console, it trains on with the schedule fixed: from the
checkpoint a person rolled back to (the SDK restores it, and the steps go on from its step), or
from the held state; terminated, it exits with brakeline.EXIT_TERMINATED (75).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from pathlib import Path

import torch

import brakeline

CHECKPOINT_EVERY = 200
BASE_LR = 0.02
LR_GROWTH = 1.08
BATCH = 32


def build(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(4096, 8, generator=generator)
    noise = 0.1 * torch.randn(4096, 1, generator=generator)
    targets = torch.sin(inputs[:, :4].sum(dim=1, keepdim=True)) + noise
    dataset = torch.utils.data.TensorDataset(inputs, targets)
    return model, optimizer, torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True)


class DemoRun:
    """The training loop; its state is only touched in the training thread (the resume hook
    runs there too, when the pause ends)."""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.run = brakeline.init(
            job=options.job,
            url=options.url,
            token=options.token,
            checkpoint_dir=str(options.checkpoint_dir),
            spill_dir=str(options.spill_dir),
            heartbeat_interval=2.0,
            flush_interval=0.25,
        )
        self.run.seed(options.seed)
        self.model, self.optimizer, loader = build(options.seed)
        self.loader = self.run.wrap_loader(loader)
        self.run.watch(model=self.model, optimizer=self.optimizer)
        self.run.on_resume(self.fix_schedule)
        self.schedule_fixed = False
        self.step = 0

    def fix_schedule(self, info: brakeline.PauseInfo) -> None:
        """The run resumes with its schedule fixed: the learning rate back to its base. A roll
        back the console's confirmation named was restored by the SDK before this (weights,
        optimizer, ``run.step``); a plain resume trains on from the held state, which the step
        guard kept finite."""
        self.schedule_fixed = True
        for group in self.optimizer.param_groups:
            group["lr"] = BASE_LR
        print(f"demo training: resumed at step {self.run.step} with the schedule fixed")

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.step = self.run.step + 1  # the run's step: a roll back moves it back
        if self.step >= self.options.diverge_at and not self.schedule_fixed:
            for group in self.optimizer.param_groups:
                group["lr"] *= LR_GROWTH  # the bug this demo is about
        started = time.perf_counter()
        self.optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), math.inf)
        self.optimizer.step()
        seconds = max(time.perf_counter() - started, 1e-9)
        self.run.log(
            {
                "loss": loss,
                "grad_norm": grad_norm,
                "lr": self.optimizer.param_groups[0]["lr"],
                "perf.samples_per_second": BATCH / seconds,
            },
            step=self.step,
        )
        healthy = self.step < self.options.diverge_at or self.schedule_fixed
        if self.step % CHECKPOINT_EVERY == 0 and healthy and math.isfinite(loss.item()):
            self.run.checkpoint(self.step)
        self.run.step_boundary(self.step)

    def train(self) -> None:
        pace = 1.0 / self.options.steps_per_second
        limit = self.options.steps
        while limit is None or self.step < limit:
            for inputs, targets in self.loader:
                started = time.monotonic()
                self.train_step(inputs, targets)
                if limit is not None and self.step >= limit:
                    break
                time.sleep(max(0.0, pace - (time.monotonic() - started)))
        self.run.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    # None: the SDK reads BRAKELINE_TOKEN, as the demo passes it (a command line is public).
    parser.add_argument("--token", default=None)
    parser.add_argument("--job", default="demo-run")
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--spill-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--diverge-at", type=int, default=500)
    parser.add_argument("--steps-per-second", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=7)
    demo = DemoRun(parser.parse_args())
    # `manage.py demo` ends with SIGTERM (Ctrl-C reaches us as SIGINT): leave through the
    # normal exit, so the run finishes and the console sees a last heartbeat.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        demo.train()
    except KeyboardInterrupt:
        pass
    finally:
        demo.run.finish(timeout=5.0)


if __name__ == "__main__":
    main()
