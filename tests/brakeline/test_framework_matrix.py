"""The framework matrix, plain PyTorch and the Hugging Face Trainer (Lightning: in
test_framework_matrix_lightning.py): each framework × each fault, through the framework's own
call path, the recording transport answering as the console's rules do. Every cell: 0 poisoned
updates, 0 steps past the held step, the brake checkpoint finite and labelled with the step its
weights hold (tests/brakeline/matrix.py). The console's own listing of these labels is checked
against the live console in test_integration_live_frameworks.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.brakeline.matrix import (  # noqa: E402
    FAULT_AT,
    FAULTS,
    Console,
    TinyModel,
    assert_braked_cleanly,
    dataset,
    held_step,
    weights,
)


def _plain_loop(run, model, optimizer, console):
    """The loop docs/sdk.md shows, with the weights recorded after every step."""
    x, y = dataset()
    after_step = {0: weights(model)}
    loader = run.wrap_loader(torch.utils.data.DataLoader(list(zip(x, y, strict=True)), 8))
    for inputs, targets in loader:
        step = run.step + 1
        console.wait_for_spike_answer(run, step)
        loss = model.loss(inputs, targets)
        run.guard(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        run.log({"loss": loss}, step=step)
        after_step[step] = weights(model)
        run.step_boundary(step)
        if run.finished:  # terminated in the hold
            break
    return after_step


@pytest.mark.parametrize("guard_device", ["auto", "always"])
@pytest.mark.parametrize("fault", FAULTS)
def test_plain_pytorch(make_run, transport, fault, guard_device):
    run = make_run(guard_hold_seconds=60.0, guard_device=guard_device)
    console = Console(transport, fault)
    model = TinyModel(fault, lambda: run.step + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    run.watch(model=model, optimizer=optimizer)
    after_step = _plain_loop(run, model, optimizer, console)
    saved = torch.load(run.last_checkpoint.path, weights_only=False)
    checkpoint = [t.float() for t in saved["models"][0].values()]
    # The device path (forced on the CPU by "always"), as on an accelerator, learns of a refused
    # update one step later: it refuses that step's update too and holds after it.
    lag = 1 if guard_device == "always" else 0
    assert_braked_cleanly(run, model, fault, after_step, checkpoint, lag=lag)


# -- Hugging Face Trainer ---------------------------------------------------------------------
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from brakeline.integrations.huggingface import BrakelineCallback  # noqa: E402


class _Record(transformers.TrainerCallback):
    """Weights after each optimizer step (before the Brakeline callback's boundary)."""

    def __init__(self, model, after_step, console, run):
        self.model, self.after_step, self.console, self.run = model, after_step, console, run

    def on_step_begin(self, args, state, control, **kwargs):
        self.console.wait_for_spike_answer(self.run, state.global_step + 1)

    def on_step_end(self, args, state, control, **kwargs):
        self.after_step[state.global_step] = weights(self.model)


def _hf_weights(folder):
    from safetensors.torch import load_file

    tensors = load_file(f"{folder}/model.safetensors")
    return [tensors[name].float() for name in sorted(tensors, key=_parameter_order)]


def _parameter_order(name: str) -> tuple[int, int]:
    # net.0.weight, net.0.bias, net.2.weight, net.2.bias: the model's parameter order
    _, layer, kind = name.split(".")
    return int(layer), 0 if kind == "weight" else 1


HF_VARIANTS = {
    "no-accumulation": (1, "auto"),
    "accumulate-2": (2, "auto"),
    "device-path": (1, "always"),  # the guard's accelerator path, forced on the CPU
}


@pytest.mark.parametrize("variant", list(HF_VARIANTS))
@pytest.mark.parametrize("fault", FAULTS)
def test_hugging_face_trainer(make_run, transport, tmp_path, fault, variant):
    accumulate, guard_device = HF_VARIANTS[variant]
    run = make_run(guard_hold_seconds=60.0, guard_device=guard_device)
    console = Console(transport, fault)
    model = TinyModel(fault, lambda: run.step + 1)
    x, y = dataset()
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=FAULT_AT + 6,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=accumulate,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        learning_rate=0.01,
        seed=0,
    )
    after_step = {0: weights(model)}
    trainer = transformers.Trainer(
        model=model,
        args=arguments,
        train_dataset=[{"x": x[i], "labels": y[i]} for i in range(len(x))],
        callbacks=[_Record(model, after_step, console, run), BrakelineCallback(run)],
    )
    trainer.train()
    lag = 1 if guard_device == "always" else 0
    saved = _hf_weights(run.last_checkpoint.path)
    result = assert_braked_cleanly(run, model, fault, after_step, saved, lag=lag)
    assert result["path"].endswith(f"checkpoint-{held_step(fault, lag)}")
    assert result["reason"] == "brake"
