"""A tiny Lightning fit with the SDK's callback (CPU), for the integration tests.

The loss of step --nan-at is made NaN inside training_step; the callback logs it at the batch
end, the console brakes. Lightning's own hooks do the rest: the callback's saver is
trainer.save_checkpoint, terminate sets trainer.should_stop and the process exits with 75.
"""

from __future__ import annotations

import math
import time

import lightning.pytorch as pl
import torch
from _common import LossFile, arguments, start_run

from brakeline.integrations.lightning import BrakelineCallback


class Regressor(pl.LightningModule):
    def __init__(self, nan_at: int, step_seconds: float, losses: LossFile) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.nan_at, self.step_seconds, self.losses = nan_at, step_seconds, losses

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.net(inputs), targets)
        step = self.trainer.global_step + 1  # the step this batch completes
        if step == self.nan_at:
            loss = loss * math.nan
        self.losses.write(step, loss.item())
        if self.step_seconds:
            time.sleep(self.step_seconds)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def main() -> None:
    options = arguments(__doc__.splitlines()[0])
    run = start_run(options)
    run.seed(options.seed)
    losses = LossFile(options.losses)
    generator = torch.Generator().manual_seed(7)
    inputs = torch.randn(256, 8, generator=generator)
    data = torch.utils.data.TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    trainer = pl.Trainer(
        max_steps=options.steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(options.work_dir),
        callbacks=[BrakelineCallback(run)],
    )
    model = Regressor(options.nan_at, options.step_seconds, losses)
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=16, shuffle=True))
    losses.close()
    run.finish()


if __name__ == "__main__":
    main()
