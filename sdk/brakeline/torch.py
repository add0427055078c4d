"""torch helpers: counting non-finite losses and gradients so a NaN can never be masked.

Import as ``brakeline.torch`` (this module imports torch itself; ``import brakeline`` does not).
"""

from __future__ import annotations

import math
import threading
from typing import Any

import torch

from brakeline._shards import local


def count_nonfinite(tensor: torch.Tensor) -> torch.Tensor:
    """Number of NaN/Inf elements, as a 0-d tensor on the tensor's device (no host sync); of a
    sharded tensor, in this rank's shard (no collective)."""
    tensor = local(tensor)
    if tensor.is_sparse:
        tensor = tensor.coalesce().values()
    if not (tensor.is_floating_point() or tensor.is_complex()):
        return torch.zeros((), dtype=torch.int64, device=tensor.device)
    if tensor.device.type == "cpu" and tensor.is_floating_point() and tensor.numel():
        # On the CPU a host read costs nothing: one aminmax pass answers "all finite?" and the
        # elements are counted only when they are not (the rare case).
        low, high = torch.aminmax(tensor)
        if math.isfinite(low.item()) and math.isfinite(high.item()):
            return torch.zeros((), dtype=torch.int64)
    return torch.count_nonzero(~torch.isfinite(tensor))


def _loss_of(output: Any) -> torch.Tensor | None:
    """The loss a model returned itself: HF ``ModelOutput.loss`` or a dict's ``"loss"``."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


class NonFiniteCounter:
    """Counts non-finite values in the model's gradients and in the losses it returns.

    Gradient hooks count every NaN/Inf gradient element during backward; a forward hook counts
    non-finite ``loss`` outputs (so the HF Trainer's NaN-loss filter cannot hide them). Counts
    stay on the device until read, so counting adds kernels but no synchronisation.

    Thread-safety: autograd may run hooks in its own device threads, so the accumulators are
    guarded by a lock; :meth:`take` swaps them out atomically.
    """

    def __init__(
        self, model: torch.nn.Module | None = None, *, gradients: bool = True, losses: bool = True
    ) -> None:
        self._lock = threading.Lock()
        self._handles: list[Any] = []
        self._grad_counts: dict[torch.device, torch.Tensor] = {}
        self._loss_counts: dict[torch.device, torch.Tensor] = {}
        self._losses_seen = 0
        self.watches_gradients = False
        if model is not None:
            self.attach(model, gradients=gradients, losses=losses)

    def attach(
        self, model: torch.nn.Module, *, gradients: bool = True, losses: bool = True
    ) -> NonFiniteCounter:
        """Install the hooks on ``model`` (call :meth:`detach` to remove them)."""
        if gradients:
            for parameter in model.parameters():
                if parameter.requires_grad:
                    self._handles.append(parameter.register_hook(self._on_gradient))
            self.watches_gradients = True
        if losses:
            self._handles.append(model.register_forward_hook(self._on_forward))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _on_gradient(self, gradient: torch.Tensor) -> None:
        self._add(self._grad_counts, count_nonfinite(gradient))

    def _on_forward(self, module: Any, inputs: Any, output: Any) -> None:
        loss = _loss_of(output)
        if loss is not None:
            self.observe_loss(loss)

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Count a loss by hand (for models that do not return their loss)."""
        with self._lock:
            self._losses_seen += 1
        self._add(self._loss_counts, count_nonfinite(loss.detach()))

    def add_gradient_count(self, count: torch.Tensor) -> None:
        """Add a count of non-finite gradient elements made elsewhere (the step guard)."""
        self._add(self._grad_counts, count)

    def count_gradients(self, model: torch.nn.Module) -> None:
        """Count the current ``.grad`` of every parameter (an alternative to the hooks)."""
        for parameter in model.parameters():
            if parameter.grad is not None:
                self._add(self._grad_counts, count_nonfinite(parameter.grad))
        self.watches_gradients = True

    def _add(self, counts: dict[torch.device, torch.Tensor], value: torch.Tensor) -> None:
        with self._lock:
            previous = counts.get(value.device)
            counts[value.device] = value if previous is None else previous + value

    def take(self) -> tuple[Any, int, Any]:
        """(loss count, losses observed, gradient count) since the last take; resets them.

        Counts are tensors (or 0); reading them with float() is left to the caller's thread.
        """
        with self._lock:
            losses, self._loss_counts = self._loss_counts, {}
            grads, self._grad_counts = self._grad_counts, {}
            seen, self._losses_seen = self._losses_seen, 0
        loss_total = _sum_counts(losses.values())
        grad_total = _sum_counts(grads.values()) if self.watches_gradients else None
        return loss_total, seen, grad_total

    def read(self) -> dict[str, int]:
        """Synchronously read and reset the counts (handy in tests and custom loops)."""
        loss_total, seen, grad_total = self.take()
        result = {"nonfinite.loss": int(loss_total)} if seen else {}
        if grad_total is not None:
            result["nonfinite.grad"] = int(grad_total)
        return result


def _sum_counts(values: Any) -> Any:
    """Sum per-device counts without a host sync (the sender thread's float() does that)."""
    total: Any = 0
    for value in values:
        total = value if isinstance(total, int) else total + value.to(total.device)
    return total
