"""The Hugging Face Trainer callback on a real (tiny, CPU) Trainer run."""

import math
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it

from brakeline.integrations.huggingface import BrakelineCallback  # noqa: E402


class TinyRegressor(torch.nn.Module):
    """Returns its own loss like a transformers model; poisons it with NaN at one call."""

    def __init__(self, nan_at_call=None):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.calls = 0
        self.nan_at_call = nan_at_call

    def forward(self, x, labels=None):
        self.calls += 1
        output = self.layer(x)
        if self.calls == self.nan_at_call:
            output = output * math.nan
        return {"loss": torch.nn.functional.mse_loss(output, labels), "logits": output}


def _train(run, tmp_path, model, max_steps=6):
    torch.manual_seed(0)
    inputs, targets = torch.randn(32, 4), torch.randn(32, 1)
    dataset = [{"x": inputs[i], "labels": targets[i]} for i in range(32)]
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        learning_rate=0.01,
        max_grad_norm=0.0,
    )
    trainer = transformers.Trainer(
        model=model, args=arguments, train_dataset=dataset, callbacks=[BrakelineCallback(run)]
    )
    trainer.train()
    return trainer


def test_a_nan_loss_hidden_by_the_trainer_is_still_counted(make_run, transport, tmp_path):
    run = make_run()
    _train(run, tmp_path, TinyRegressor(nan_at_call=3))
    run.flush(2.0)
    points = transport.points()
    logged_losses = [p["value"] for p in points if p["name"] == "loss"]
    # The Trainer's logging_nan_inf_filter replaced the NaN losses with finite averages...
    assert logged_losses and all(isinstance(value, float) for value in logged_losses)
    # ...but the counter on the model saw them, and the NaN gradients they caused.
    nonfinite = {p["step"]: p["value"] for p in points if p["name"] == "nonfinite.loss"}
    assert nonfinite[3] >= 1 and nonfinite[1] == 0
    assert sum(p["value"] for p in points if p["name"] == "nonfinite.grad") >= 1


def test_checkpoint_and_pause_uses_the_trainers_own_checkpoint(make_run, tmp_path):
    run = make_run()
    run.inbox.offer({"id": 5, "kind": "checkpoint_and_pause", "reason": "drill"})
    run.inbox.offer({"id": 6, "kind": "resume"})
    trainer = _train(run, tmp_path, TinyRegressor())
    acks = {ack["id"]: ack for ack in run.acknowledgements}
    result = acks[5]["result"]
    assert acks[5]["status"] == "succeeded"
    assert result["path"] == os.path.abspath(tmp_path / "hf" / "checkpoint-1")
    assert result["step"] == 1 and result["bytes"] > 0 and len(result["sha256"]) == 64
    assert os.path.isdir(result["path"])
    assert acks[6]["status"] == "succeeded"
    assert trainer.state.global_step == 6


def test_terminate_stops_training_and_exits_75(make_run, exits, tmp_path):
    run = make_run()
    run.inbox.offer({"id": 7, "kind": "terminate"})
    trainer = _train(run, tmp_path, TinyRegressor())
    assert trainer.state.global_step == 1
    assert exits.codes == [75]
