"""Lightning's documented resume, ``trainer.fit(model, loader, ckpt_path=...)``, is bit for bit
the run that never stopped: from the SDK's own pause checkpoint (mid-epoch), from a checkpoint
written at a batch end, and from one written at an epoch end. The data order comes from
``ResumableSampler`` (a function of the seed and the epoch, started at the batch after the
checkpoint's); every RNG state from the callback's part of the checkpoint; dropout makes the
RNG matter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from brakeline.integrations.lightning import BrakelineCallback, ResumableSampler  # noqa: E402

STEPS = 30  # 12 batches an epoch: two and a half epochs


class Module(pl.LightningModule):
    def __init__(self, losses: dict[int, str]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
        )
        self.losses = losses

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.net(inputs), targets)
        self.losses[self.trainer.global_step + 1] = float(loss).hex()
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class SaveAt(pl.Callback):
    """Writes a plain Lightning checkpoint at a batch end or an epoch end."""

    def __init__(self, path, step=None, epoch=None):
        self.path, self.step, self.epoch = path, step, epoch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch:
            trainer.save_checkpoint(self.path)


def fit(run, tmp_path, callbacks=(), ckpt_path=None) -> dict[int, str]:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(96, 8, generator=generator)
    dataset = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).cos())
    sampler = ResumableSampler(dataset, shuffle=True, seed=11)
    losses: dict[int, str] = {}
    trainer = pl.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[BrakelineCallback(run, sampler=sampler), *callbacks],
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler)
    torch.manual_seed(1234)  # the process's RNG: the resumed one must not depend on it
    trainer.fit(Module(losses), loader, ckpt_path=ckpt_path)
    return losses


@pytest.fixture
def reference(make_run, tmp_path) -> dict[int, str]:
    losses = fit(make_run(), tmp_path / "reference")
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def _resumed(make_run, tmp_path, path, reference, after):
    torch.manual_seed(99)  # another process, another RNG: the checkpoint must restore it
    losses = fit(make_run(), tmp_path / "resumed", ckpt_path=str(path))
    assert sorted(losses) == list(range(after + 1, STEPS + 1))
    matching = sum(losses[s] == reference[s] for s in losses)
    assert matching == len(losses), f"{matching} of {len(losses)} losses match"


def test_resume_from_the_pause_checkpoint_is_bit_exact(make_run, tmp_path, reference):
    run = make_run(checkpoint_dir=str(tmp_path / "brakeline"))

    class BrakeAt(pl.Callback):  # the console's checkpoint_and_pause, then terminate
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step + 1 == 17:
                run.inbox.offer({"id": 1, "kind": "checkpoint_and_pause"})
                run.inbox.offer({"id": 2, "kind": "terminate"})

    fit(run, tmp_path / "braked", callbacks=[BrakeAt()])
    assert run.last_checkpoint is not None and run.last_checkpoint.step == 17
    _resumed(make_run, tmp_path, run.last_checkpoint.path, reference, after=17)


@pytest.mark.parametrize("where, after", [({"step": 7}, 7), ({"step": 12}, 12), ({"epoch": 0}, 12)])
def test_resume_from_a_lightning_checkpoint_is_bit_exact(
    make_run, tmp_path, reference, where, after
):
    path = tmp_path / "saved.ckpt"
    fit(make_run(), tmp_path / "first", callbacks=[SaveAt(path, **where)])
    _resumed(make_run, tmp_path, path, reference, after=after)
