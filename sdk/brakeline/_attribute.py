"""Re-run to attribute: does a refused step's non-finite value come back on the same batch?

When the step guard (brakeline._guard) refuses an update, the weights and optimizer state are
still those from before the step. If the step was computed by a closure (PyTorch's
``optimizer.step(closure)`` convention: the closure clears the gradients, computes the loss on
its batch, back-propagates and returns the loss), the guard can evaluate that closure once
more, from that unchanged state, with the random number generators put back where they were
before the first evaluation (same dropout masks, same augmentation draws), and compare:

- the non-finite value comes back: the batch (or the model state it meets) produces it
  deterministically. Attribution ``"data"``: roll back and skip the batch; flag it.
- it does not come back: the same computation on the same inputs gave a finite result, so
  the first one was corrupted on its way: a transient fault of the device or the node.
  Attribution ``"transient"``: flag the node.

Opt-in (``rerun_nonfinite=True``): re-running runs your closure's code a second time (its
forward, backward and anything it logs), which only you can say is harmless. The re-run leaves
no trace: the generators and the watched models' buffers (batch-norm statistics) are put back
as the first evaluation left them, and the update stays refused either way. Where the guard
reads its flag a step late (an accelerator's device path), the refused step's closure is kept
until then, and re-run when the flag is read: the mask has put the weights back, so they are
the step's pre-step state again (not when a later backward's gradients wait for the
optimizer: those are not overwritten). A finding is reported in the acknowledgement of the
brake that follows (``result.rerun``: docs/protocol.md), which the console's recovery verdict
weighs (docs/recovery.md). Training thread only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

from brakeline._rng import generator_states, set_generator_states

logger = logging.getLogger("brakeline")

DATA = "data"  # the non-finite repeated: the batch or the model, deterministically
TRANSIENT = "transient"  # it did not: a one-off fault of the hardware that computed it


@dataclasses.dataclass(frozen=True)
class Finding:
    """What one re-run found."""

    step: int
    attribution: str  # DATA or TRANSIENT

    def as_report(self) -> dict[str, Any]:
        """The acknowledgement's ``result.rerun``."""
        return {"step": self.step, "attribution": self.attribution}


class Rerun:
    """Captures the generators before each closure's first evaluation and, on a refused step,
    evaluates the closure again to attribute its non-finite value (see the module doc)."""

    def __init__(self) -> None:
        self.enabled = False
        # The watched models, whose buffers a re-run must not move (the run sets it).
        self.models: Callable[[], Iterable[Any]] = tuple
        self.latest: Finding | None = None
        self._unreported: Finding | None = None  # for the next brake's acknowledgement

    def before_first(self) -> dict[str, Any] | None:
        """The generators' state before a closure's first evaluation (None: not enabled)."""
        return generator_states() if self.enabled else None

    def attribute(
        self,
        step: int,
        closure: Callable[[], Any],
        streams: dict[str, Any],
        repeats: Callable[[Any], bool],
    ) -> Finding | None:
        """Evaluate ``closure`` again from the generators' state ``streams``; ``repeats(loss)``
        says whether its loss or the gradients it left are still non-finite. None when the
        closure itself fails (nothing is concluded from a re-run that did not run)."""
        import torch

        after_first = generator_states()
        buffers = [(b, b.detach().clone()) for model in self.models() for b in model.buffers()]
        set_generator_states(streams)
        try:
            with torch.enable_grad():
                loss = closure()
            repeated = repeats(loss)
        except Exception:  # the re-run must never break training: the step is refused anyway
            logger.exception("brakeline: the re-run of step %d failed (not attributed)", step)
            return None
        finally:
            set_generator_states(after_first)
            with torch.no_grad():
                for buffer, before in buffers:
                    buffer.copy_(before)
        finding = Finding(step, DATA if repeated else TRANSIENT)
        self.latest = self._unreported = finding
        logger.error(
            "brakeline: re-ran step %d on the same batch from the same state: %s",
            step,
            "the non-finite value repeated (the data or the model)"
            if repeated
            else "finite this time (a transient fault of this node)",
        )
        return finding

    def take_report(self) -> dict[str, Any] | None:
        """The latest finding not reported yet, for the next brake's acknowledgement
        (``result.rerun``); None when there is none."""
        finding, self._unreported = self._unreported, None
        return None if finding is None else finding.as_report()
