"""A tiny Hugging Face Trainer run with the SDK's callback (CPU, no downloads).

A GPT-2 built from a configuration (random weights) learns random token sequences. A forward
hook makes the model's own loss NaN at forward call --nan-at; the Trainer hides that NaN from
its logged loss (``logging_nan_inf_filter``) but not from its grad_norm, and the SDK's
counter reports it as ``nonfinite.loss``. checkpoint_and_pause makes the Trainer save its own
``checkpoint-N`` folder, which the SDK hashes and acknowledges before holding.
"""

from __future__ import annotations

import math
import time

import torch
import transformers
from _common import LossFile, arguments, start_run

from brakeline.integrations.huggingface import BrakelineCallback


class Pace(transformers.TrainerCallback):
    def __init__(self, step_seconds: float) -> None:
        self.step_seconds = step_seconds

    def on_step_end(self, args, state, control, **kwargs):
        if self.step_seconds:
            time.sleep(self.step_seconds)


def poison_and_record(model, nan_at: int, losses: LossFile):
    """Forward hook: the raw loss of every call goes to the losses file; call nan_at's is NaN."""
    calls = [0]

    def hook(module, inputs, output):
        calls[0] += 1
        if calls[0] == nan_at:
            output["loss"] = output["loss"] * math.nan
        losses.write(calls[0], output["loss"].item())
        return output

    return model.register_forward_hook(hook)


def main() -> None:
    options = arguments(__doc__.splitlines()[0])
    run = start_run(options)
    run.seed(options.seed)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    model = transformers.GPT2LMHeadModel(config)
    losses = LossFile(options.losses)
    poison_and_record(model, options.nan_at, losses)
    generator = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, 64, (64, 16), generator=generator)
    dataset = [{"input_ids": row, "labels": row} for row in tokens]
    arguments_ = transformers.TrainingArguments(
        output_dir=str(options.work_dir / "hf"),
        max_steps=options.steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        learning_rate=1e-3,
        seed=options.seed,
    )
    trainer = transformers.Trainer(
        model=model,
        args=arguments_,
        train_dataset=dataset,
        callbacks=[BrakelineCallback(run), Pace(options.step_seconds)],
    )
    trainer.train()
    losses.close()
    run.finish()


if __name__ == "__main__":
    main()
