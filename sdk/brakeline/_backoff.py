"""Exponential backoff with jitter, shared by every retrying loop of the SDK."""

from __future__ import annotations

import random


class Backoff:
    """Delays of base * 2**attempt, capped, with "equal jitter" (half fixed, half random).

    Equal jitter keeps a guaranteed minimum wait (so a dead console is not hammered) while
    spreading the retries of many ranks that lost the console at the same moment.
    Not thread-safe: each retrying loop owns its own instance.
    """

    def __init__(self, base: float = 0.5, cap: float = 30.0, rng: random.Random | None = None):
        if base <= 0 or cap < base:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base = base
        self.cap = cap
        self.attempt = 0
        # A private generator: never disturb the training's seeded global `random` state.
        self._rng = rng or random.Random()

    def ceiling(self, attempt: int) -> float:
        """The largest delay the given attempt number may produce."""
        return min(self.cap, self.base * (2 ** min(attempt, 62)))

    def next_delay(self, retry_after: float | None = None, max_retry_after: float = 300.0) -> float:
        """The wait before the next try; a server's Retry-After wins when it is longer."""
        ceiling = self.ceiling(self.attempt)
        self.attempt += 1
        delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, max_retry_after))
        return delay

    def reset(self) -> None:
        self.attempt = 0
