"""The built-in drill workload: a small real PyTorch run through the SDK (CPU).

Run as a script (never imported by the console; it needs only torch and the ``brakeline``
SDK), by the drill runner through the job's executor, with BRAKELINE_URL, BRAKELINE_TOKEN and
BRAKELINE_DRILL_SANDBOX=1 in its environment. It trains an MLP on a fixed regression task,
checkpoints every ``--checkpoint-every`` steps (so an L4, which saves nothing, still leaves a
checkpoint to restart from), guards every update, and waits for the console's fault.

``--verify PATH --sha256 HEX`` is the scorecard's "loads" check, in a fresh process: restore the
checkpoint (hash verified first), run one training step, print one JSON line, exit 0 — or
print why not and exit 1. ``--verify -`` reads ``{"path", "sha256"}`` from standard input
instead, so the drill can start the process (and its torch import) ahead of time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

import brakeline


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, object, torch.utils.data.DataLoader]:
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 1),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=200, gamma=0.9)
    data = torch.randn(1024, 16, generator=torch.Generator().manual_seed(3))
    target = data[:, :8].sum(dim=1, keepdim=True).tanh()
    dataset = torch.utils.data.TensorDataset(data, target)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True)
    return model, optimizer, scheduler, loader


def train_step(model, optimizer, inputs, targets, run=None) -> tuple[torch.Tensor, torch.Tensor]:
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    if run is not None:
        run.guard(loss)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    optimizer.step()  # the SDK's guard skips it when the gradients are not finite
    return loss, grad_norm


def train(options: argparse.Namespace) -> None:
    work = Path(options.work_dir)
    run = brakeline.init(
        job="drill",
        spill_dir=str(work / "spill"),
        checkpoint_dir=str(work / "checkpoints"),
        heartbeat_interval=0.2,
        flush_interval=0.05,
        backoff_base=0.05,
        backoff_cap=1.0,
        ack_wait_before_release=5.0,
        finish_timeout=20.0,
        send_snapshots=False,
    )
    run.seed(1234)
    model, optimizer, scheduler, loader = build()
    run.watch(model=model, optimizer=optimizer, scheduler=scheduler)
    # This process is the job's only one: leaving the node is what stopping does.
    run.on_command("isolate_node", lambda run, command, step: {"node": command.params.get("node")})
    # The release hook: here a real job frees its accelerators (the SDK notes for the drill
    # that it ran: the scorecard's release line).
    run.on_release(lambda info: print(f"accelerators released at step {info.step}", flush=True))
    wrapped = run.wrap_loader(loader)
    while run.step < options.steps:
        for inputs, targets in wrapped:
            step = run.step + 1
            loss, grad_norm = train_step(model, optimizer, inputs, targets, run)
            scheduler.step()
            lr = optimizer.param_groups[0]["lr"]
            # Under this step's number: until step_boundary the run is still at the last one.
            run.log({"loss": loss, "grad_norm": grad_norm, "lr": lr}, step=step)
            run.step_boundary(step)
            if step % options.checkpoint_every == 0:
                run.checkpoint(reason="manual")
            time.sleep(options.step_seconds)
            if run.step >= options.steps:
                break
    run.finish()


def verify(options: argparse.Namespace) -> int:
    model, optimizer, scheduler, loader = build()
    path, sha256 = options.verify, options.sha256
    if path == "-":  # started ahead (torch imported): the checkpoint comes on stdin
        named = json.loads(sys.stdin.readline() or "{}")
        path, sha256 = named.get("path", ""), named.get("sha256")
    try:
        state = brakeline.restore(
            path, model=model, optimizer=optimizer, scheduler=scheduler, expected_sha256=sha256
        )
        inputs, targets = next(iter(loader))
        loss, grad_norm = train_step(model, optimizer, inputs, targets)
    except Exception as error:  # any failure is the answer: the checkpoint does not load
        print(json.dumps({"loads": False, "error": f"{type(error).__name__}: {error}"}))
        return 1
    finite = math.isfinite(loss.item()) and math.isfinite(grad_norm.item())
    weights = all(torch.isfinite(p).all() for p in model.parameters())
    print(json.dumps({"loads": finite and bool(weights), "step": state.step, "loss": loss.item()}))
    return 0 if finite and weights else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default=".")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-seconds", type=float, default=0.02)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--verify", default=None)
    parser.add_argument("--sha256", default=None)
    options = parser.parse_args()
    if options.verify:
        return verify(options)
    train(options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
