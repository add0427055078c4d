"""The framework matrix, Lightning: automatic optimisation (Lightning hands ``optimizer.step``
a closure), manual optimisation (``self.optimizers().step()`` after ``manual_backward``),
gradient accumulation and bf16 mixed precision on the CPU, × every fault, through a real
``Trainer.fit``. The same assertions as the other frameworks (tests/brakeline/matrix.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

from brakeline.integrations.lightning import BrakelineCallback  # noqa: E402
from tests.brakeline.matrix import (  # noqa: E402
    FAULT_AT,
    FAULTS,
    Console,
    TinyModel,
    assert_braked_cleanly,
    dataset,
    weights,
)

VARIANTS = {
    "automatic": {},
    "manual": {"manual": True},
    "accumulate-2": {"accumulate_grad_batches": 2},
    "bf16-mixed": {"precision": "bf16-mixed"},
    # The guard's device path (what runs on an accelerator), forced on the CPU.
    "automatic-device-path": {"guard_device": "always"},
    "manual-device-path": {"manual": True, "guard_device": "always"},
    # A fused optimizer takes the flag as its found_inf (no masking copies).
    "automatic-device-path-fused": {"fused": True, "guard_device": "always"},
}


class Module(pl.LightningModule):
    def __init__(self, model: TinyModel, manual: bool = False, fused: bool = False) -> None:
        super().__init__()
        self.model = model
        self.automatic_optimization = not manual
        self.fused = fused

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = self.model.loss(inputs, targets)
        if not self.automatic_optimization:
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01, fused=self.fused)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class Record(pl.Callback):
    """Weights after each optimizer step; the console's answer to a spike (placed before the
    Brakeline callback, so it sees each step before the boundary)."""

    def __init__(self, run, console, after_step):
        self.run, self.console, self.after_step = run, console, after_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.console.wait_for_spike_answer(self.run, trainer.global_step + 1)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after_step[trainer.global_step] = weights(pl_module.model)


def fit(run, console, model, tmp_path, variant, callbacks_after=(), **trainer_options):
    options = dict(VARIANTS[variant])
    manual = options.pop("manual", False)
    fused = options.pop("fused", False)
    options.pop("guard_device", None)
    x, y = dataset()
    after_step = {0: weights(model)}
    trainer = pl.Trainer(
        max_steps=FAULT_AT + 6,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[Record(run, console, after_step), BrakelineCallback(run), *callbacks_after],
        **options,
        **trainer_options,
    )
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    trainer.fit(Module(model, manual=manual, fused=fused), loader)
    return trainer, after_step


def checkpoint_weights(path) -> list[torch.Tensor]:
    state = torch.load(path, weights_only=False)["state_dict"]
    return [tensor.float() for tensor in state.values()]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lightning(make_run, transport, tmp_path, variant, fault):
    guard_device = VARIANTS[variant].get("guard_device", "auto")
    run = make_run(guard_hold_seconds=60.0, guard_device=guard_device)
    console = Console(transport, fault)
    model = TinyModel(fault, lambda: run.step + 1)
    trainer, after_step = fit(run, console, model, tmp_path, variant)
    saved = checkpoint_weights(run.last_checkpoint.path)
    # The device path learns of a refused update one step later and holds after that step.
    lag = 1 if guard_device == "always" else 0
    result = assert_braked_cleanly(run, model, fault, after_step, saved, lag=lag)
    assert result["path"].endswith(".ckpt")
    assert trainer.global_step == result["step"]  # Lightning stopped at the held step


def test_without_the_guard_a_lightning_checkpoint_claims_no_weights_step(
    make_run, transport, tmp_path
):
    """Nothing watched the updates: the console must not be told they are clean."""
    run = make_run(guard=False, guard_hold_seconds=60.0)
    model = TinyModel(None, lambda: run.step + 1)

    class BrakeAt(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step + 1 == FAULT_AT:
                run.inbox.offer({"id": 1, "kind": "checkpoint_and_pause"})
                run.inbox.offer({"id": 2, "kind": "terminate"})

    fit(run, Console(transport, "none"), model, tmp_path, "automatic", callbacks_after=[BrakeAt()])
    result = next(a for a in run.acknowledgements if a["id"] == 1)["result"]
    assert result["step"] == FAULT_AT and "weights_step" not in result


def test_lightnings_closure_is_re_run_to_attribute_a_refused_step(make_run, transport, tmp_path):
    """Automatic optimisation hands the guard Lightning's closure: with the re-run on, the
    refused step's training_step and backward run once more on the same batch; the poisoned
    batch gives NaN again (data), said in the brake's acknowledgement, and the brake is as
    clean as without the re-run."""
    run = make_run(guard_hold_seconds=60.0, rerun_nonfinite=True)
    console = Console(transport, "poisoned_batch")
    model = TinyModel("poisoned_batch", lambda: run.step + 1)
    _, after_step = fit(run, console, model, tmp_path, "automatic")
    saved = checkpoint_weights(run.last_checkpoint.path)
    result = assert_braked_cleanly(run, model, "poisoned_batch", after_step, saved, lag=0)
    assert result["rerun"] == {"step": FAULT_AT, "attribution": "data"}
    assert model.steps_seen.count(FAULT_AT) == 2  # evaluated, then re-run once
