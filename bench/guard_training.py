"""The training process of bench/guard.py: a small real PyTorch run through the SDK (CPU).

--fault poisons step --at: the loss (nan_loss, inf_loss, minus_inf_loss) or one gradient
element (nan_grad, inf_grad). Each step's loss goes to --losses as float.hex, so two runs can be
compared bit for bit. --framework lightning trains the same model through a real Lightning
``Trainer.fit`` with the SDK's callback (Lightning hands the optimizer a closure).
"""

from __future__ import annotations

import argparse
import time

import torch

import brakeline

POISON = {"nan_loss": "nan", "inf_loss": "inf", "minus_inf_loss": "-inf"}


def poison_loss(options, step, loss):
    if step == options.at and options.fault.endswith("_loss"):
        return loss + float(POISON[options.fault])
    return loss


def poison_gradient(options, step, model):
    if step == options.at and options.fault.endswith("_grad"):
        bad = float("nan" if options.fault == "nan_grad" else "inf")
        next(model.parameters()).grad[0, 0] = bad


def train_loop(options, run, model, optimizer, scheduler, loader):
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    wrapped = run.wrap_loader(loader)
    with open(options.losses, "w", buffering=1) as losses:
        while run.step < options.steps:
            for inputs, targets in wrapped:
                step = run.step + 1
                loss = poison_loss(
                    options, step, torch.nn.functional.mse_loss(model(inputs), targets)
                )
                run.guard(loss)
                optimizer.zero_grad()
                loss.backward()
                poison_gradient(options, step, model)
                optimizer.step()
                scheduler.step()
                run.log({"loss": loss}, step=step)
                losses.write(f"{step} {loss.item().hex()}\n")
                run.step_boundary(step)
                time.sleep(options.step_seconds)
                if run.step >= options.steps:
                    break


def train_lightning(options, run, model, loader):
    import lightning.pytorch as pl

    from brakeline.integrations.lightning import BrakelineCallback

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            step = self.trainer.global_step + 1
            inputs, targets = batch
            loss = poison_loss(options, step, torch.nn.functional.mse_loss(model(inputs), targets))
            losses.write(f"{step} {loss.item().hex()}\n")
            time.sleep(options.step_seconds)
            return loss

        def on_after_backward(self):
            poison_gradient(options, self.trainer.global_step + 1, model)

        def configure_optimizers(self):
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }

    trainer = pl.Trainer(
        max_steps=options.steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=options.work_dir,
        callbacks=[BrakelineCallback(run)],
    )
    with open(options.losses, "w", buffering=1) as losses:
        trainer.fit(Module(), loader)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fault", default="")
    parser.add_argument("--at", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--losses", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--no-guard", action="store_true")
    parser.add_argument("--step-seconds", type=float, default=0.01)
    parser.add_argument("--framework", choices=("loop", "lightning"), default="loop")
    options = parser.parse_args()
    run = brakeline.init(
        job="bench-guard",
        spill_dir=f"{options.work_dir}/spill",
        checkpoint_dir=f"{options.work_dir}/ckpt",
        heartbeat_interval=0.5,
        flush_interval=1.0,
        guard=not options.no_guard,
        send_snapshots=False,
    )
    run.seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    data = torch.randn(1024, 16, generator=torch.Generator().manual_seed(3))
    target = data[:, :8].sum(dim=1, keepdim=True).tanh()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(data, target), batch_size=32, shuffle=True
    )
    if options.framework == "lightning":
        train_lightning(options, run, model, loader)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
        train_loop(options, run, model, optimizer, scheduler, loader)
    run.finish()


if __name__ == "__main__":
    main()
