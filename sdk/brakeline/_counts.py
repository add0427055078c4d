"""The non-finite counts every ``run.log`` carries: ``nonfinite.loss`` and ``nonfinite.grad``.

A :class:`brakeline.torch.NonFiniteCounter` is attached to each watched model (once: watching
it again must not count twice). The step guard scans the gradients anyway: where it reads its
flag at once (every parameter in host memory), it counts for the counter, and no gradient hook
scans them a second time. Training thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from brakeline._encoding import LogRecord
from brakeline._guard import StepGuard

if TYPE_CHECKING:
    from brakeline.torch import NonFiniteCounter


class NonFiniteCounts:
    """The run's non-finite counters, and their counts added to each log record."""

    def __init__(self, guard: StepGuard) -> None:
        self._guard = guard
        self.counters: list[NonFiniteCounter] = []
        self._counted_models: set[int] = set()

    def count(self, model: Any, guarded: bool) -> None:
        """Attach a counter to ``model``; ``guarded``: the guard watches its optimizer."""
        if id(model) in self._counted_models:
            return
        from brakeline.torch import NonFiniteCounter

        self._counted_models.add(id(model))
        by_guard = guarded and self._guard.counts_gradients_of(model)
        counter = NonFiniteCounter(model, gradients=not by_guard)
        if by_guard:
            self._guard.count_into(counter)
        self.counters.append(counter)

    def add(self, counter: NonFiniteCounter) -> None:
        """A counter built by hand (e.g. ``NonFiniteCounter(model, gradients=False)``)."""
        self.counters.append(counter)

    def attach_to(self, record: LogRecord) -> None:
        """Add the counts since the last record. They may be device tensors: added without
        reading them (no sync here)."""
        for counter in self.counters:
            losses, observed, gradients = counter.take()
            record.loss_nonfinite = (
                losses if record.loss_nonfinite is None else record.loss_nonfinite + losses
            )
            record.loss_observed += observed
            if gradients is not None:
                record.grad_nonfinite = (
                    gradients
                    if record.grad_nonfinite is None
                    else record.grad_nonfinite + gradients
                )

    def detach(self) -> None:
        """The run finished: remove the counters' hooks from the models."""
        for counter in self.counters:
            counter.detach()
