"""Acknowledgements: the run's answer to each console command, queued for the control loop.

An acknowledgement carries what the command did (its result), what your own handler added to
it, the step the console meant it to apply at, and, in a multi-rank job, the rank that answers:
the console counts the ranks' answers (all at the same step, or split). Training thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from brakeline._encoding import to_jsonable
from brakeline._link import DeliveryOutbox
from brakeline._transport import encode_json

logger = logging.getLogger("brakeline")


class Acknowledgements:
    """Builds, records and queues the run's acknowledgements."""

    def __init__(
        self, outbox: DeliveryOutbox, rank: int, multi_rank: bool, wait_seconds: float
    ) -> None:
        self._outbox = outbox
        self._rank = rank
        self._multi_rank = multi_rank
        self._wait_seconds = wait_seconds  # before a pause releases: the console has the ack
        self.sent: list[dict[str, Any]] = []  # every acknowledgement, in order
        # Your handler's result for a command whose built-in behaviour acknowledges it.
        self.handler_results: dict[str, dict[str, Any]] = {}
        self._apply_at: dict[str, int] = {}

    def note_apply_at(self, command_id: int | str, step: int) -> None:
        """The console stamped the command with the step to apply it at: the ack says so, and
        the console compares the ranks' steps by it."""
        self._apply_at[str(command_id)] = step

    def ack(
        self,
        command_id: int | str,
        status: str,
        result: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """Acknowledge a command (queued; delivered by the control thread with retries)."""
        merged = {**self.handler_results.pop(str(command_id), {}), **dict(result or {})}
        apply_at = self._apply_at.pop(str(command_id), None)
        if apply_at is not None:
            merged.setdefault("apply_at_step", apply_at)
        if self._multi_rank:
            merged.setdefault("rank", self._rank)
        body: dict[str, Any] = {"status": status, "result": to_jsonable(merged)}
        if error:
            body["error"] = error
        self.sent.append({"id": command_id, **body})
        log = logger.info if status == "succeeded" else logger.warning
        log("brakeline: command %s %s %s", command_id, status, error or "")
        self._outbox.enqueue(
            f"ack:{command_id}", f"commands/{command_id}/ack", encode_json(body), urgent=True
        )

    def wait(self, command_id: int | str) -> bool:
        """Wait (bounded) until the console has the acknowledgement; True if it does."""
        return self._outbox.wait_delivered(f"ack:{command_id}", self._wait_seconds)
