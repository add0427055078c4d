"""The training process of bench/guard.py: a small real PyTorch run through the SDK (CPU).

--fault poisons step --at: the loss (nan_loss, inf_loss, minus_inf_loss) or one gradient
element (nan_grad, inf_grad). Each step's loss goes to --losses as float.hex, so two runs can be
compared bit for bit.
"""

from __future__ import annotations

import argparse
import time

import torch

import brakeline


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", default="")
    parser.add_argument("--at", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--losses", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--no-guard", action="store_true")
    parser.add_argument("--step-seconds", type=float, default=0.01)
    options = parser.parse_args()
    run = brakeline.init(
        job="bench-guard", spill_dir=f"{options.work_dir}/spill",
        checkpoint_dir=f"{options.work_dir}/ckpt", heartbeat_interval=0.5,
        flush_interval=1.0, guard=not options.no_guard, send_snapshots=False,
    )  # fmt: skip
    run.seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
    data = torch.randn(1024, 16, generator=torch.Generator().manual_seed(3))
    target = data[:, :8].sum(dim=1, keepdim=True).tanh()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data, target), batch_size=32, shuffle=True
    )
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    wrapped = run.wrap_loader(loader)
    with open(options.losses, "w", buffering=1) as losses:
        while run.step < options.steps:
            for inputs, targets in wrapped:
                step = run.step + 1
                loss = torch.nn.functional.mse_loss(model(inputs), targets)
                if step == options.at and options.fault.endswith("_loss"):
                    poison = {"nan_loss": "nan", "inf_loss": "inf", "minus_inf_loss": "-inf"}
                    loss = loss + float(poison[options.fault])
                run.guard(loss)
                optimizer.zero_grad()
                loss.backward()
                if step == options.at and options.fault.endswith("_grad"):
                    bad = float("nan" if options.fault == "nan_grad" else "inf")
                    next(model.parameters()).grad[0, 0] = bad
                optimizer.step()
                scheduler.step()
                run.log({"loss": loss}, step=step)
                losses.write(f"{step} {loss.item().hex()}\n")
                run.step_boundary(step)
                time.sleep(options.step_seconds)
                if run.step >= options.steps:
                    break
    run.finish()


if __name__ == "__main__":
    main()
