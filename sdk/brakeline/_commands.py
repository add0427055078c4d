"""Commands from the console, the inbox that hands them to the training thread, and how a
handler answers one (a result, :class:`CommandFailed`, or :data:`ACK_LATER`).

Commands arrive on three background paths (websocket push, heartbeat replies, metrics replies)
and repeat until acknowledged, so the inbox de-duplicates by command id. The training thread
takes them at a step boundary; no command is ever applied from a background thread.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterable, Mapping
from typing import Any

KINDS = (
    "lower_lr",
    "pause_data",
    "checkpoint_and_pause",
    "resume",
    "terminate",
    "isolate_node",
    "inject_fault",  # drill sandboxes only (_drill.py)
)
# Returned by a handler that acknowledges by itself (a pause confirms *before* it blocks).
ACK_LATER = object()


class CommandFailed(Exception):
    """Raised by a handler to acknowledge a command as failed with a clear error."""

    def __init__(self, error: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(error)
        self.result = result or {}


@dataclasses.dataclass(frozen=True)
class Command:
    """One console command: ``{"id", "kind", "params", "severity", "reason", "issued_at",
    "apply_at_step"}``. ``apply_at_step`` (multi-rank jobs): the step boundary at which every
    rank applies it; None: the first boundary after it arrives."""

    id: int | str
    kind: str
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    severity: str = ""
    reason: str = ""
    issued_at: str = ""
    apply_at_step: int | None = None

    def due(self, step: int) -> bool:
        return self.apply_at_step is None or step >= self.apply_at_step

    @classmethod
    def from_json(cls, payload: Mapping[str, Any]) -> Command | None:
        """Parse a command object; None when it has no usable id or kind."""
        command_id = payload.get("id")
        kind = payload.get("kind")
        if command_id is None or isinstance(command_id, bool) or not isinstance(kind, str):
            return None
        params = payload.get("params")
        apply_at = payload.get("apply_at_step")
        if isinstance(apply_at, bool) or not isinstance(apply_at, int) or apply_at < 0:
            apply_at = None  # absent (older consoles, single-process jobs) or unusable
        return cls(
            id=command_id,
            kind=kind,
            params=params if isinstance(params, dict) else {},
            severity=str(payload.get("severity") or ""),
            reason=str(payload.get("reason") or ""),
            issued_at=str(payload.get("issued_at") or ""),
            apply_at_step=apply_at,
        )


class CommandInbox:
    """Thread-safe, de-duplicating queue of commands waiting for the next step boundary.

    Background threads call :meth:`offer`; the training thread calls :meth:`take` and
    :meth:`wait`. A lock guards the seen-id set and the queue because offers come from several
    threads at once; ``has_pending`` is a lock-free length check for the fast path of every step.
    """

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._pending: collections.deque[Command] = collections.deque()
        self._arrived = threading.Condition()

    def offer(self, payload: Mapping[str, Any] | Command) -> bool:
        """Queue a command unless its id was already seen; True if it was new."""
        command = payload if isinstance(payload, Command) else Command.from_json(payload)
        if command is None:
            return False
        key = str(command.id)
        with self._arrived:
            if key in self._seen:
                return False
            self._seen.add(key)
            self._pending.append(command)
            self._arrived.notify_all()
        return True

    def offer_all(self, payloads: Iterable[Mapping[str, Any]]) -> int:
        return sum(self.offer(payload) for payload in payloads)

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    def take(self) -> Command | None:
        """The oldest pending command, or None. One at a time, so a handler that blocks (a
        pause) still sees the commands that arrived behind it, such as its ``resume``."""
        with self._arrived:
            return self._pending.popleft() if self._pending else None

    def has_due(self, step: int) -> bool:
        """A pending command is due at ``step`` (lock-free read of a deque snapshot)."""
        return any(command.due(step) for command in tuple(self._pending))

    def due_id(self, step: int) -> int:
        """The highest numeric id among the commands due at ``step`` (0: none): what this rank
        puts into the ranks' agreement (``_ranksync.py``)."""
        with self._arrived:
            ids = [_numeric(c.id) for c in self._pending if c.due(step)]
        return max((number for number in ids if number is not None), default=0)

    def take_due(self, step: int, up_to: int | None = None) -> Command | None:
        """The oldest pending command due at ``step`` (and, with ``up_to``, with an id not
        above it: what the ranks agreed on), or None. Commands not yet due stay queued."""
        with self._arrived:
            for command in self._pending:
                if not command.due(step) and up_to is None:
                    continue
                number = _numeric(command.id)
                if up_to is not None and number is not None and number > up_to:
                    continue
                self._pending.remove(command)
                return command
        return None

    def knows(self, command_id: int | str) -> bool:
        with self._arrived:
            return str(command_id) in self._seen

    def wait_for(self, command_id: int | str, timeout: float) -> bool:
        """Block until the command ``command_id`` has arrived (or timeout passes)."""
        with self._arrived:
            return self._arrived.wait_for(lambda: str(command_id) in self._seen, timeout)

    def wait(self, timeout: float) -> bool:
        """Block until a command is pending or timeout passes; True if one is pending."""
        with self._arrived:
            if not self._pending:
                self._arrived.wait(timeout)
            return bool(self._pending)

    def wake(self) -> None:
        """Wake a training thread blocked in :meth:`wait` (used when the run is finishing)."""
        with self._arrived:
            self._arrived.notify_all()


def _numeric(command_id: int | str) -> int | None:
    """The id as a number, or None: ids the console did not number take no part in the
    ranks' agreement."""
    if isinstance(command_id, int) and not isinstance(command_id, bool):
        return command_id
    return None
