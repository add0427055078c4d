"""A team's own training script, as a user would write it with the SDK inside: not the
built-in drill workload. A small classifier (cross-entropy, SGD with momentum) that takes its
console, token and checkpoint folder from the environment (``brakeline.init()`` with no
arguments), watches its model, guards its loss, checkpoints every 5 steps and frees its
"accelerators" in a release hook. ``--verify -`` is its verify command: it reads
``{"path", "sha256"}`` on stdin, restores, runs one step and prints ``{"loads": ...}``.

It also writes the names of its environment variables to ``$TRAIN_DIR/environment.json``: the
drill test checks the console's secrets never reached it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch

import brakeline


def build():
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    inputs = torch.randn(256, 8, generator=torch.Generator().manual_seed(11))
    labels = (inputs[:, 0] > 0).long() + (inputs[:, 1] > 0.5).long()
    return model, optimizer, inputs, labels


def one_step(model, optimizer, inputs, labels, run=None) -> float:
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    if run is not None:
        run.guard(loss)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def train() -> None:
    work = Path(os.environ.get("TRAIN_DIR", "."))
    (work / "environment.json").write_text(json.dumps(sorted(os.environ)))
    run = brakeline.init(heartbeat_interval=0.2, flush_interval=0.05, send_snapshots=False)
    model, optimizer, inputs, labels = build()
    run.watch(model=model, optimizer=optimizer)
    run.on_release(lambda info: (work / "gpus-freed").write_text(str(info.step)))
    while True:
        for start in range(0, len(inputs), 32):
            step = run.step + 1
            batch = slice(start, start + 32)
            loss = one_step(model, optimizer, inputs[batch], labels[batch], run)
            run.log({"loss": loss})
            run.step_boundary(step)
            if step % 5 == 0:
                run.checkpoint(reason="manual")
            time.sleep(0.02)


def verify() -> int:
    named = json.loads(sys.stdin.readline() or "{}")
    model, optimizer, inputs, labels = build()
    try:
        state = brakeline.restore(
            named["path"], model=model, optimizer=optimizer, expected_sha256=named["sha256"]
        )
        loss = one_step(model, optimizer, inputs[:32], labels[:32])
    except Exception as error:  # the answer: it does not load
        print(json.dumps({"loads": False, "error": f"{type(error).__name__}: {error}"}))
        return 1
    print(json.dumps({"loads": math.isfinite(loss), "step": state.step, "loss": loss}))
    return 0 if math.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(verify() if sys.argv[1:] == ["--verify", "-"] else train())
