"""One step for all ranks: every rank of a job applies a command at the same step boundary.

Two mechanisms, the second a safety net under the first:

1. **apply_at_step.** For a multi-rank job the console stamps each command that changes the
   training state with the step at which to apply it: above the highest step any rank has
   reported, with a margin of a few seconds' worth of steps (``breakers.control.apply_at``).
   A rank that has it applies it at exactly that boundary, wherever it came from (websocket,
   heartbeat reply, metrics reply).
2. **Agreement.** Where ``torch.distributed`` is initialised, the ranks also agree at the
   boundary, through the job's own process group: one ``all_reduce(MAX)`` of three int64s,
   ``[due command id, step, -step]``. If any rank has a command due, every rank learns its id
   *at the same boundary*, and a rank that has not received it yet waits for it there (the
   others, past the same collective, wait too, so no rank is inside a collective while
   another holds). The last two numbers give the highest and lowest step of the ranks: they
   differ only when the ranks count steps differently (a restart from checkpoints of
   different steps), which is logged loudly.

The collective costs one tiny all_reduce per ``agreement_every`` steps (bench/ranks_sync.py).
Every rank must use the same ``agreement_every``, as every rank must call the same collectives;
it is read from ``BRAKELINE_AGREEMENT_EVERY`` like the other settings.

Thread-safety: everything here runs in the training thread, at a step boundary.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, Generic

from brakeline import _handlers as handlers
from brakeline._acks import Acknowledgements
from brakeline._commands import ACK_LATER, Command, CommandFailed, CommandInbox
from brakeline._drill import DrillFaults
from brakeline._pause import PauseController, PauseState
from brakeline._roles import TargetT
from brakeline._settings import Settings
from brakeline._state import RunState

logger = logging.getLogger("brakeline")

MODES = ("auto", "on", "off")


class RankAgreement:
    """The per-boundary agreement of the ranks (mode: auto, on, off; see docs/sdk.md)."""

    def __init__(self, mode: str = "auto", every: int = 1) -> None:
        if mode not in MODES:
            raise ValueError(f"rank_agreement must be one of {', '.join(MODES)}, not {mode!r}")
        if every < 1:
            raise ValueError(f"agreement_every must be at least 1, not {every}")
        self.mode = mode
        self.every = every
        self.rounds = 0
        self._tensor: Any = None
        self._warned_steps = False
        self._warned_missing = False

    def active(self) -> bool:
        """True when this process is one rank of several in an initialised process group.
        Never imports torch: a run that did not import torch.distributed has no group."""
        if self.mode == "off":
            return False
        dist = sys.modules.get("torch.distributed")
        ready = bool(
            dist is not None
            and dist.is_available()
            and dist.is_initialized()
            and dist.get_world_size() > 1
        )
        if not ready and self.mode == "on" and not self._warned_missing:
            self._warned_missing = True
            logger.error(
                "brakeline: rank_agreement=on but torch.distributed is not initialised; "
                "commands are applied at apply_at_step only"
            )
        return ready

    def due(self, step: int) -> bool:
        """This boundary is an agreement boundary (the same on every rank)."""
        return step % self.every == 0 and self.active()

    def agree(self, step: int, due_id: int) -> tuple[int, int, int]:
        """All ranks together: (highest due command id, highest step, lowest step)."""
        import torch
        import torch.distributed as dist

        tensor = self._tensor
        if tensor is None:
            device = torch.device("cpu")
            if "nccl" in str(dist.get_backend()):
                # NCCL reduces device tensors only; reading it back is one small sync.
                device = torch.device("cuda", torch.cuda.current_device())
            tensor = self._tensor = torch.zeros(3, dtype=torch.int64, device=device)
        tensor[0], tensor[1], tensor[2] = due_id, step, -step
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        self.rounds += 1
        agreed, highest, lowest = (int(value) for value in tensor.tolist())
        lowest = -lowest
        if highest != lowest and not self._warned_steps:
            self._warned_steps = True
            logger.error(
                "brakeline: the ranks are at different steps at the same boundary (%d to %d): "
                "they count steps differently (resumed from checkpoints of different steps?); "
                "commands are applied at the same boundary, not the same step number",
                lowest,
                highest,
            )
        return agreed, highest, lowest


# How often a rank waiting at an agreed boundary for a command it has not received asks the
# console again (a heartbeat, whose reply carries every command this rank has not acked).
ASK_AGAIN_SECONDS = 1.0


class BoundaryCommands(Generic[TargetT]):
    """Which commands are due at a boundary, the ranks' agreement on them, and applying one:
    your handler for its kind composed with the built-in behaviour (brakeline._handlers),
    acknowledged through ``acks``. ``target`` is what handlers receive (the run); the built-in
    pause commands start ``pause``, a fire drill's ``inject_fault`` plans on ``drill``."""

    def __init__(
        self,
        target: TargetT,
        settings: Settings,
        state: RunState,
        inbox: CommandInbox,
        acks: Acknowledgements,
        agreement: RankAgreement,
        pause: PauseController,
        drill: DrillFaults,
        ask_console: Callable[[], None],
    ) -> None:
        self._target = target
        self._settings = settings
        self._state = state
        self._inbox = inbox
        self._acks = acks
        self.agreement = agreement
        self._pause = pause
        self._builtins = handlers.builtin_handlers(pause, drill)
        self._ask_console = ask_console  # a heartbeat now: its reply carries missed commands
        self.handlers: dict[str, handlers.Handler[TargetT]] = {}  # your own, per kind
        self._logs_with_command_waiting = 0

    def note_waiting(self) -> None:
        """A run.log call while a command is due and not applied yet."""
        # Metrics flow while a delivered command is never applied: step_boundary is missing
        # from the loop. Said once per waiting stretch, loudly, long before an executor acts.
        self._logs_with_command_waiting += 1
        if self._logs_with_command_waiting == self._settings.unapplied_command_logs:
            logger.error(
                "brakeline: a console command has waited through %d run.log calls without "
                "being applied: is run.step_boundary(step) called in your training loop? "
                "Commands are applied only there (or while a wrapped loader fetches).",
                self._logs_with_command_waiting,
            )

    def at_boundary(self, step: int, fetching: bool = False) -> None:
        """Apply what is due at this boundary: after the ranks' agreement where there is a
        process group (at step boundaries only: a loader's fetch is not one every rank makes
        at the same point), else the commands whose apply_at_step has come."""
        agreement = self.agreement
        if agreement.active():
            if not fetching and step % agreement.every == 0:
                self._agree_and_apply(step)
        elif self._inbox.has_pending:
            self._process(step)

    def _agree_and_apply(self, step: int) -> None:
        agreed, _, _ = self.agreement.agree(step, self._inbox.due_id(step))
        if agreed and self._await_command(agreed):
            self._process(step, up_to=agreed)

    def _await_command(self, command_id: int) -> bool:
        """Another rank has command ``command_id`` due here and this one has not received it:
        wait for it at this boundary (every rank is past the same collective, so nobody is
        blocked inside one), asking the console again now and then. False past the wait."""
        if self._inbox.knows(command_id):
            return True
        state, wait_seconds = self._state, self._settings.agreement_wait_seconds
        logger.warning(
            "brakeline: another rank applies command %s at step %d; waiting for it here",
            command_id,
            state.step,
        )
        deadline = time.monotonic() + wait_seconds
        while not state.finished:
            self._ask_console()
            state.keepalive()  # held on purpose: heartbeats must not turn this into a hang
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self._inbox.wait_for(command_id, min(remaining, ASK_AGAIN_SECONDS)):
                return True
        logger.error(
            "brakeline: command %s did not reach this rank within %.0f s; the other ranks "
            "applied it at step %d without this one (the console raises a split-job alert)",
            command_id,
            wait_seconds,
            state.step,
        )
        return False

    def _process(self, step: int, up_to: int | None = None) -> None:
        # A save the framework makes in a later hook leaves the commands behind it (its
        # resume) in the inbox, for that pause's hold to take.
        while not (self._state.finished or self._pause.state is PauseState.SAVE_REQUESTED):
            command = self._inbox.take_due(step, up_to)
            if command is None:
                return
            self._logs_with_command_waiting = 0
            self.apply(command, step)

    def apply(self, command: Command, step: int) -> None:
        """Apply one command now and acknowledge it (unless its handler does so itself)."""
        handler = handlers.composed(self.handlers.get(command.kind), command.kind, self._builtins)
        logger.warning(
            "brakeline: applying %s (command %s, %s) at step %d: %s",
            command.kind,
            command.id,
            command.severity or "-",
            step,
            command.reason,
        )
        if command.apply_at_step is not None:
            # The ack says where it was meant to apply; the console compares the ranks' steps.
            self._acks.note_apply_at(command.id, command.apply_at_step)
        ack = self._acks.ack
        try:
            result = handler(self._target, command, step)
        except CommandFailed as failure:
            ack(command.id, "failed", failure.result, str(failure))
        except Exception as error:  # a failing command must not kill training
            logger.exception("brakeline: command %s failed", command.kind)
            ack(command.id, "failed", {"step": step}, f"{type(error).__name__}: {error}")
        else:
            if result is not ACK_LATER:
                ack(command.id, "succeeded", result if isinstance(result, dict) else {})

    def apply_own(self, command: Command, step: int) -> Any:
        """Your handler for the command's kind alone, its answer returned (None if there is
        none): a held pause's resume, which the pause itself then completes."""
        own = self.handlers.get(command.kind)
        return own(self._target, command, step) if own is not None else None
