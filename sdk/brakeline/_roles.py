"""What the parts that obey the console need of each other, each as a narrow interface.

The run (``brakeline._run``) composes these parts and sits above all of them; none of them
imports it. Where a part needs something of the run, or of a part built after it, it names
only that here, and the run (or that part) provides it without importing this module:

- :class:`CommandTarget`: what the built-in command handlers and fire drills act on. Your own
  handlers receive the run itself, which is one.
- :class:`HeldCommands`: what a held pause does with the commands that arrive meanwhile
  (apply a ``lower_lr``; let your ``resume`` handler judge the resume that ends it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar

from brakeline._checkpoint import CheckpointResult, TrainingObjects
from brakeline._commands import Command, CommandInbox


class CommandTarget(Protocol):
    """The run as a command acts on it: its training objects, its step, its checkpoints."""

    training: TrainingObjects
    inbox: CommandInbox

    @property
    def step(self) -> int: ...

    @property
    def handler_results(self) -> dict[str, dict[str, Any]]: ...

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None: ...

    def checkpoint(self, step: int | None = None, reason: str = "manual") -> CheckpointResult: ...

    def roll_back(self, params: Mapping[str, Any]) -> dict[str, Any]: ...

    def terminate(self, command: Command, step: int) -> None: ...


# The type of what your handlers receive (the run), known where they are registered.
TargetT = TypeVar("TargetT", bound=CommandTarget)


class HeldCommands(Protocol):
    """The commands as a held pause applies them (brakeline._ranksync.BoundaryCommands)."""

    def apply(self, command: Command, step: int) -> None:
        """Apply one command now (your handler, then the built-in behaviour) and ack it."""
        ...

    def apply_own(self, command: Command, step: int) -> Any:
        """Your handler for the command's kind alone, its answer returned (None if there is
        none); it may raise. Nothing is acknowledged."""
        ...
