"""A data-loader wrapper that knows its position and can be paused by the console.

``run.wrap_loader(loader)`` returns a :class:`PausableLoader`. Before fetching each batch it
calls the run's gate, which blocks (in the training thread, applying console commands as they
arrive) while a ``pause_data`` is in force. It records, per epoch, the random state at the moment
the underlying iterator was created, so a restored run can rebuild the same shuffled order and
fast-forward to the saved batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from brakeline._rng import capture_rng_state, restore_rng_state


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


class PausableLoader:
    """Iterate it exactly like the wrapped loader; one ``for`` loop over it is one epoch.

    Thread-safety: used only from the training thread (iteration, state_dict, load_state_dict).
    """

    def __init__(
        self,
        loader: Iterable[Any],
        before_fetch: Callable[[], None] | None = None,
        skip: Callable[[], bool] | None = None,
    ):
        self.loader = loader
        self._skip = skip or (lambda: False)
        self.epoch = -1  # the first __iter__ makes it 0
        self.batch_in_epoch = 0
        self.total_batches = 0
        self._before_fetch = before_fetch or (lambda: None)
        self._epoch_start_rng: dict[str, Any] | None = None
        self._resume: dict[str, Any] | None = None
        self._rng_after_resume: dict[str, Any] | None = None

    def __len__(self) -> int:
        length = _length(self.loader)
        if length is None:
            raise TypeError("the wrapped loader has no length")
        return length

    def __getattr__(self, name: str) -> Any:
        # Delegate dataset, sampler, batch_size... so the wrapper can replace the loader.
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        iterator = self._start_epoch()
        while True:
            self._before_fetch()
            if self._resume is not None:
                # Rolled back while this loop was running (a hold inside the gate or at the
                # step boundary): continue from the restored position in this same loop.
                iterator = self._resume_epoch()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.batch_in_epoch += 1
            self.total_batches += 1
            if self._skip():
                continue  # a batch the roll back said to drop: fetched, never trained on
            yield batch

    def _start_epoch(self) -> Iterator[Any]:
        if self._resume is not None:
            return self._resume_epoch()
        self.epoch += 1
        self.batch_in_epoch = 0
        # CPU generators only: samplers draw their shuffle seed from these, in this thread.
        self._epoch_start_rng = capture_rng_state(include_cuda=False)
        return iter(self.loader)

    def _resume_epoch(self) -> Iterator[Any]:
        position, self._resume = self._resume, None
        assert position is not None
        self.epoch = int(position["epoch"])
        self.total_batches = int(position["total_batches"]) - int(position["batch_in_epoch"])
        self.batch_in_epoch = 0
        self._epoch_start_rng = position.get("epoch_start_rng")
        length = position.get("epoch_length")
        if length is not None and int(position["batch_in_epoch"]) >= int(length):
            # The saved epoch was complete: nothing to replay, the next loop starts a new one.
            self.total_batches = int(position["total_batches"])
            self.batch_in_epoch = int(position["batch_in_epoch"])
            self._restore_rng_after_resume()
            return iter(())
        if self._epoch_start_rng is not None:
            restore_rng_state(self._epoch_start_rng)
        iterator = iter(self.loader)
        # Fast-forward through the batches the checkpointed run had already consumed.
        for _ in range(int(position["batch_in_epoch"])):
            try:
                next(iterator)
            except StopIteration:
                break
            self.batch_in_epoch += 1
            self.total_batches += 1
        self._restore_rng_after_resume()
        return iterator

    def _restore_rng_after_resume(self) -> None:
        if self._rng_after_resume is not None:
            restore_rng_state(self._rng_after_resume)
            self._rng_after_resume = None

    def state_dict(self) -> dict[str, Any]:
        """The data position: epoch, batch within it, total batches, the epoch's start RNG."""
        return {
            "epoch": max(self.epoch, 0),
            "batch_in_epoch": self.batch_in_epoch,
            "total_batches": self.total_batches,
            "epoch_length": _length(self.loader),
            "epoch_start_rng": self._epoch_start_rng,
        }

    def position(self) -> dict[str, Any]:
        """The position without RNG blobs (for snapshots and acknowledgements)."""
        state = self.state_dict()
        state.pop("epoch_start_rng")
        return state

    def load_state_dict(
        self, state: dict[str, Any], rng_after: dict[str, Any] | None = None
    ) -> None:
        """Make the next ``for`` loop continue where the saved run stopped.

        ``rng_after`` (the generators at checkpoint time) is restored after the fast-forward,
        so the first batch after resuming sees exactly the random state it saw originally.
        """
        if state.get("epoch_start_rng") is None and state.get("batch_in_epoch"):
            raise ValueError("this data position has no epoch RNG state; cannot fast-forward")
        self._resume = dict(state)
        self._rng_after_resume = rng_after
