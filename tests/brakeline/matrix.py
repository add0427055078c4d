"""The framework matrix's shared parts: a tiny model that poisons one step the way a fault
would, the console's answer to the brake (the recording transport), and the assertions every
cell makes (no poisoned update, no step past the hold, a finite checkpoint labelled with the
step its weights hold).

Steps are counted as the SDK counts them: step N is the N-th optimizer step, and ``run.step + 1``
is the step being computed (with gradient accumulation, every micro-batch of it).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

FAULTS = ("nan_loss", "nan_grad", "inf_grad", "poisoned_batch", "loss_spike")
FAULT_AT = 5
SPIKE = 1.0e4


class TinyModel(torch.nn.Module):
    """Regression MLP; ``fault`` strikes the step ``FAULT_AT`` (every micro-batch of it)."""

    def __init__(self, fault: str | None, current_step: Any) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        self.fault = fault
        self.current_step = current_step  # () -> the step being computed
        self.steps_seen: list[int] = []
        if fault in ("nan_grad", "inf_grad"):
            self.net[0].weight.register_hook(self._poison_gradient)

    def _poison_gradient(self, gradient: torch.Tensor) -> torch.Tensor:
        if self.current_step() != FAULT_AT:
            return gradient
        gradient = gradient.clone()
        gradient[0, 0] = math.nan if self.fault == "nan_grad" else math.inf
        return gradient

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        step = self.current_step()
        self.steps_seen.append(step)
        if self.fault == "poisoned_batch" and step == FAULT_AT:
            x = x.clone()
            x[0, 0] = math.nan  # one bad sample in the batch
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y.float())
        if step == FAULT_AT and self.fault == "nan_loss":
            loss = loss * math.nan
        if step == FAULT_AT and self.fault == "loss_spike":
            loss = loss * SPIKE  # finite: the guard lets it by, the console's rule brakes
        return loss

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        return {"loss": self.loss(x, labels)}


def dataset(samples: int = 96) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(samples, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone().float() for p in model.parameters()]


@dataclass
class Console:
    """Answers like the console's default rules: a guard trip or a loss spike brakes the job
    (checkpoint_and_pause), then the on-call terminates it. The spike's answer reaches the run
    while it computes the next step (``wait_for_spike_answer``)."""

    transport: Any
    fault: str
    braked_at_point: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.transport.responder = self.respond

    def respond(self, path: str, body: dict[str, Any]) -> None:
        if path != "metrics" or self.transport.commands:
            return None
        for point in body["points"]:
            value = point.get("value")
            spiked = point["name"] == "loss" and isinstance(value, float) and value > SPIKE / 100
            if point["name"] == "guard.skipped_updates" or spiked:
                self.braked_at_point.append(point["step"])
                self.transport.commands = [
                    {"id": 1, "kind": "checkpoint_and_pause", "severity": "L3"},
                    {"id": 2, "kind": "terminate"},
                ]
        return None

    def wait_for_spike_answer(self, run: Any, step: int) -> None:
        """Called while step ``FAULT_AT + 1`` is computed: the console has seen the spike."""
        if self.fault != "loss_spike" or step != FAULT_AT + 1 or run.finished:
            return
        deadline = time.monotonic() + 60
        while not run.inbox.has_pending and time.monotonic() < deadline:
            run.flush(1.0)
            time.sleep(0.01)


def held_step(fault: str, lag: int = 0) -> int:
    """Where the run holds: the faulty step itself, or (a finite spike, braked by the console
    from its metrics) the step during which the console's answer arrived. ``lag`` 1: the
    guard's device path, whose host learns of the refused update one step later (and refuses
    that step's update too)."""
    return FAULT_AT + 1 if fault == "loss_spike" else FAULT_AT + lag


def assert_braked_cleanly(
    run: Any,
    model: TinyModel,
    fault: str,
    after_step: dict[int, list[torch.Tensor]],
    checkpoint_weights: list[torch.Tensor],
    lag: int = 0,
) -> dict[str, Any]:
    """What every cell proves; returns the brake's acknowledgement result."""
    held = held_step(fault, lag)
    acks = {a["id"]: a for a in run.acknowledgements}
    assert acks[1]["status"] == "succeeded", acks
    result = acks[1]["result"]
    assert result["step"] == held
    # Labelled with the step its weights hold: the one before the fault when the guard refused
    # it, else (a finite spike) every update up to the held step.
    expected_weights_step = held if fault == "loss_spike" else FAULT_AT - 1
    assert result["weights_step"] == expected_weights_step
    # 0 poisoned updates: the checkpoint holds exactly the weights after that step, finite.
    assert all(torch.isfinite(w).all() for w in checkpoint_weights)
    expected = after_step[expected_weights_step]
    assert len(checkpoint_weights) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(checkpoint_weights, expected, strict=True))
    # 0 steps past: nothing was computed after the held step.
    assert max(model.steps_seen) == held
    assert all(torch.isfinite(p).all() for p in model.parameters())
    if fault != "loss_spike":
        refused = list(range(FAULT_AT, held + 1))
        assert run._guard.skipped_updates == refused and not run._guard.poisoned_updates
    return result
