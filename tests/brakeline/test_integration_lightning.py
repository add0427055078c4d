"""The Lightning callback on a real (tiny, CPU) Lightning fit."""

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from brakeline.integrations.lightning import BrakelineCallback  # noqa: E402


class TinyModule(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.layer(inputs), targets)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def _fit(run, tmp_path, max_steps=6):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    callback = BrakelineCallback(run)
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[callback],
    )
    trainer.fit(TinyModule(), torch.utils.data.DataLoader(data, batch_size=4))
    return trainer


def test_commands_apply_at_batch_end_and_the_pause_saves_a_lightning_checkpoint(
    make_run, transport, tmp_path
):
    run = make_run()
    released = []
    run.on_release(released.append)
    for payload in (
        {"id": 1, "kind": "lower_lr", "params": {"factor": 0.5}},
        {"id": 2, "kind": "checkpoint_and_pause"},
        {"id": 3, "kind": "resume"},
    ):
        run.inbox.offer(payload)
    trainer = _fit(run, tmp_path)
    acks = {ack["id"]: ack for ack in run.acknowledgements}
    assert acks[1]["result"]["lrs"] == [[pytest.approx(0.05)]] and acks[1]["result"]["step"] == 1
    checkpoint = acks[2]["result"]
    assert acks[2]["status"] == "succeeded" and checkpoint["path"].endswith("step-00000001.ckpt")
    assert released and released[0].checkpoint.sha256 == checkpoint["sha256"]
    saved = torch.load(checkpoint["path"], weights_only=False)
    assert saved["global_step"] == 1 and "torch_cpu" in saved["brakeline"]["rng"]
    assert acks[3]["status"] == "succeeded"
    assert trainer.global_step == 6  # resumed and finished
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.05)
    run.flush(2.0)
    assert {p["step"] for p in transport.points() if p["name"] == "loss"} == set(range(1, 7))


def test_terminate_stops_the_trainer_gracefully_and_exits_75(make_run, exits, tmp_path):
    run = make_run()
    run.inbox.offer({"id": 9, "kind": "terminate"})
    trainer = _fit(run, tmp_path)
    assert trainer.global_step == 1
    assert exits.codes == [75]
    assert run.acknowledgements[-1]["result"]["graceful_stop"] is True
    assert run.finished
