"""The Hugging Face Trainer's documented resume, ``trainer.train(resume_from_checkpoint=...)``,
is bit for bit the run that never stopped: from the Trainer's own folder that the SDK's
checkpoint_and_pause made it write (mid-epoch), and from one its save strategy wrote. The Trainer
restores the weights, the optimizer, the schedule and every RNG state, and skips the batches of
the epoch it had already trained on; dropout makes the RNG matter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from brakeline.integrations.huggingface import BrakelineCallback  # noqa: E402

STEPS = 30  # 12 batches an epoch: two and a half epochs


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1)
        )

    def forward(self, x, labels=None):
        prediction = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(prediction, labels), "logits": prediction}


class Losses(transformers.TrainerCallback):
    """Each optimizer step's loss, bit for bit (the loss of its last forward)."""

    def __init__(self, model: Model) -> None:
        self.losses: dict[int, str] = {}
        self.last = ""
        model.register_forward_hook(self._forward)

    def _forward(self, module, inputs, output) -> None:
        if module.training:
            self.last = float(output["loss"]).hex()

    def on_step_end(self, args, state, control, **kwargs):
        self.losses[state.global_step] = self.last


def train(run, folder, callbacks=(), resume=None, save_steps=None) -> dict[int, str]:
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(96, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True).cos()
    model = Model()
    losses = Losses(model)
    arguments = transformers.TrainingArguments(
        output_dir=str(folder),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        logging_steps=1,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        learning_rate=0.01,
        lr_scheduler_type="linear",
        seed=3,
    )
    trainer = transformers.Trainer(
        model=model,
        args=arguments,
        train_dataset=[{"x": x[i], "labels": y[i]} for i in range(len(x))],
        callbacks=[losses, BrakelineCallback(run), *callbacks],
    )
    torch.manual_seed(1234)  # the process's RNG: the resumed one must not depend on it
    trainer.train(resume_from_checkpoint=resume)
    return losses.losses


@pytest.fixture
def reference(make_run, tmp_path) -> dict[int, str]:
    losses = train(make_run(), tmp_path / "reference")
    assert sorted(losses) == list(range(1, STEPS + 1))
    return losses


def _resumed(make_run, tmp_path, path, reference, after: int) -> None:
    torch.manual_seed(99)  # another process, another RNG: the checkpoint must restore it
    losses = train(make_run(), tmp_path / "resumed", resume=str(path))
    assert sorted(losses) == list(range(after + 1, STEPS + 1))
    matching = sum(losses[s] == reference[s] for s in losses)
    assert matching == len(losses), f"{matching} of {len(losses)} losses match"


def test_resume_from_the_pause_checkpoint_is_bit_exact(make_run, tmp_path, reference):
    run = make_run(checkpoint_dir=str(tmp_path / "brakeline"))

    class BrakeAt(transformers.TrainerCallback):  # the console's checkpoint_and_pause, then stop
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step + 1 == 17:
                run.inbox.offer({"id": 1, "kind": "checkpoint_and_pause"})
                run.inbox.offer({"id": 2, "kind": "terminate"})

    train(run, tmp_path / "braked", callbacks=[BrakeAt()])
    assert run.last_checkpoint is not None and run.last_checkpoint.step == 17
    assert run.last_checkpoint.path.endswith("checkpoint-17")
    _resumed(make_run, tmp_path, run.last_checkpoint.path, reference, after=17)


def test_resume_from_a_checkpoint_of_the_save_strategy_is_bit_exact(make_run, tmp_path, reference):
    train(make_run(), tmp_path / "first", save_steps=7)
    _resumed(make_run, tmp_path, tmp_path / "first" / "checkpoint-14", reference, after=14)
