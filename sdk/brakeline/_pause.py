"""The pause controller: every pause of a run goes through this one state machine.

A pause starts three ways, and all of them end in the same hold:

- ``pause_data`` with no wrapped loader, or a wrapped loader's gate: a hold, no checkpoint;
- ``checkpoint_and_pause`` saved by the SDK at the step boundary (the built-in handler; the
  Lightning callback plugs ``trainer.save_checkpoint`` in as the saver);
- ``checkpoint_and_pause`` saved by the framework in a later hook (the Hugging Face callback:
  the Trainer writes its own folder, then ``on_save`` hands it over).

The order is fixed, whoever saves: save, confirm (the ack reaches the console, bounded wait),
release (accelerators may be freed), hold. A failed or skipped save is acknowledged as failed
and goes straight to the hold: releasing without a confirmed checkpoint would lose the state.

    RUNNING → SAVING → CONFIRMING → RELEASED → HELD → RUNNING   checkpoint_and_pause, resume
    RUNNING → SAVE_REQUESTED → SAVING → …                       the framework saves later
    SAVING or SAVE_REQUESTED → HELD                             failed or skipped save
    RUNNING → HELD                                              pause_data
    RUNNING, SAVE_REQUESTED or HELD → STOPPED                   terminate, finish

STOPPED (terminate, or the run finished) is final: no new pause starts. Only the training thread
moves the state; background threads never do.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from brakeline._acks import Acknowledgements
from brakeline._checkpoint import CheckpointResult
from brakeline._commands import ACK_LATER, Command, CommandFailed, CommandInbox
from brakeline._pace import StepPace
from brakeline._roles import HeldCommands
from brakeline._state import RunState

HOLD_POLL_SECONDS = 0.5


class PauseState(enum.Enum):
    """Where a run is in its pause sequence (``run.pause_state``)."""

    RUNNING = "running"  # training; commands apply at step boundaries
    SAVE_REQUESTED = "save_requested"  # the framework writes the checkpoint in a later hook
    SAVING = "saving"  # the checkpoint is being written and hashed
    CONFIRMING = "confirming"  # saved and acked; waiting until the console has the ack
    RELEASED = "released"  # the release callbacks run: accelerators may be freed
    HELD = "held"  # blocked until resume, applying other commands meanwhile
    STOPPED = "stopped"  # terminate or finish: no new pause starts


_NEXT: dict[PauseState, frozenset[PauseState]] = {
    PauseState.RUNNING: frozenset(
        {PauseState.SAVE_REQUESTED, PauseState.SAVING, PauseState.HELD, PauseState.STOPPED}
    ),
    PauseState.SAVE_REQUESTED: frozenset({PauseState.SAVING, PauseState.HELD, PauseState.STOPPED}),
    PauseState.SAVING: frozenset({PauseState.CONFIRMING, PauseState.HELD}),
    PauseState.CONFIRMING: frozenset({PauseState.RELEASED}),
    PauseState.RELEASED: frozenset({PauseState.HELD}),
    PauseState.HELD: frozenset({PauseState.RUNNING, PauseState.STOPPED}),
    PauseState.STOPPED: frozenset(),
}
# What heartbeats say in each state (None: leave the status alone).
_HEARTBEAT_STATUS: dict[PauseState, str | None] = {
    PauseState.RUNNING: "running",
    PauseState.SAVE_REQUESTED: "checkpointing",
    PauseState.SAVING: "checkpointing",
    PauseState.CONFIRMING: "checkpointing",
    PauseState.RELEASED: "checkpointing",
    PauseState.HELD: "paused",
    PauseState.STOPPED: None,
}


@dataclasses.dataclass
class PauseInfo:
    """Given to release and resume callbacks."""

    step: int
    command_id: int | str
    reason: str
    checkpoint: CheckpointResult | None


@dataclasses.dataclass(frozen=True)
class RunActs:
    """What a pause has the run do (the run's own methods; the run keeps the hooks)."""

    set_status: Callable[[str], None]  # what heartbeats say, sent at once
    call_hooks: Callable[[str, PauseInfo], None]  # "release" or "resume"
    roll_back: Callable[[Mapping[str, Any]], dict[str, Any]]  # a resume's params
    announce_resume: Callable[[Any], None]  # a "resume" snapshot naming the checkpoint


@dataclasses.dataclass(frozen=True)
class SaveRequest:
    """A checkpoint_and_pause whose checkpoint the framework writes in a later hook."""

    command: Command
    step: int
    requested_at: float


class PauseController:
    """The run's pause state and the sequences that move it. Training thread only.

    It is given what it uses of the run: its state (finished, stopping, status), its inbox and
    acknowledgements, its step pace, its wrapped loaders (a pause_data gate), and the run's own
    acts it starts: calling the release and resume hooks, rolling back, announcing a resume
    (a ``resume`` snapshot). The commands a hold applies are attached as :attr:`commands` once
    they exist, since they start pauses through this controller in turn.
    """

    commands: HeldCommands

    def __init__(
        self,
        state: RunState,
        inbox: CommandInbox,
        acks: Acknowledgements,
        pace: StepPace,
        loaders: Sequence[object],
        acts: RunActs,
    ) -> None:
        self._run_state = state
        self._inbox = inbox
        self._acks = acks
        self._pace = pace
        self._loaders = loaders  # the run's list: loaders wrapped later count
        self._acts = acts
        self.state = PauseState.RUNNING
        # pause_data with a wrapped loader: the loader's gate holds before its next batch.
        self.data_paused = False
        self.save_request: SaveRequest | None = None
        self._info: PauseInfo | None = None  # the pause in progress

    def _enter(self, state: PauseState) -> None:
        if state not in _NEXT[self.state]:
            raise RuntimeError(f"brakeline: pause state {self.state.name} -> {state.name}")
        self.state = state
        status = _HEARTBEAT_STATUS[state]
        if status is not None and not self._run_state.finished:
            self._acts.set_status(status)

    # -- starting a pause ------------------------------------------------------------------------
    def refusal(self, step: int) -> dict[str, Any] | None:
        """None when a pause command may start a pause; the result to acknowledge instead when
        one is already under way. Raises CommandFailed once the run is stopping."""
        if self.state is PauseState.RUNNING:
            return None
        if self.state is PauseState.STOPPED:
            raise CommandFailed("the run is stopping (terminate); it does not pause any more")
        checkpoint = self._info.checkpoint if self._info is not None else None
        result = checkpoint.as_dict() if checkpoint is not None else {}
        return {**result, "step": step, "already_paused": True}

    def pause_data(self, command: Command, step: int) -> Any:
        """Stop consuming data: a wrapped loader holds before its next batch (the result to
        acknowledge is returned); with none, acknowledge and hold right here (ACK_LATER)."""
        self.data_paused = True
        if self._loaders:
            return {"step": step, "where": "data_loader"}
        self._acks.ack(command.id, "succeeded", {"step": step, "where": "step_boundary"})
        self.hold(step, PauseInfo(step, command.id, command.reason, None))
        return ACK_LATER

    def request_save(self, command: Command, step: int) -> None:
        """The framework saves in a later hook, which then calls :meth:`checkpoint_and_pause`
        (or :meth:`abandon_save`). The commands behind this one wait in the inbox meanwhile."""
        self._enter(PauseState.SAVE_REQUESTED)
        self.save_request = SaveRequest(command, step, time.monotonic())

    # -- the sequence ----------------------------------------------------------------------------
    def checkpoint_and_pause(
        self, command: Command, step: int, save: Callable[[], CheckpointResult]
    ) -> None:
        """Save, confirm, release, hold (returns when the pause ends). ``save`` writes or
        hands over the checkpoint; if it raises, the ack is failed and nothing is released."""
        self.save_request = None
        info = PauseInfo(step, command.id, command.reason, None)
        self._info = info
        self._enter(PauseState.SAVING)
        try:
            info.checkpoint = save()
        except Exception as error:  # a failed save must still pause and be reported
            self._hold_without_checkpoint(
                info,
                f"checkpoint failed ({type(error).__name__}: {error}); training is paused "
                "without a new checkpoint and accelerators are kept",
            )
            return
        self._enter(PauseState.CONFIRMING)
        self._acks.ack(command.id, "succeeded", info.checkpoint.as_dict())
        self._acks.wait(command.id)
        # Release only after a confirmed save: freeing accelerators without one loses the state.
        self._enter(PauseState.RELEASED)
        self._acts.call_hooks("release", info)
        self.hold(step, info)

    def abandon_save(self, step: int, error: str) -> None:
        """The framework skipped the save it was asked for: still pause, report the failure,
        keep the accelerators."""
        request, self.save_request = self.save_request, None
        if request is None:
            return
        info = PauseInfo(step, request.command.id, request.command.reason, None)
        self._info = info
        self._hold_without_checkpoint(info, error)

    def _hold_without_checkpoint(self, info: PauseInfo, error: str) -> None:
        self._acks.ack(info.command_id, "failed", {"step": info.step, "paused": True}, error)
        self.hold(info.step, info)

    def stop(self) -> None:
        """Terminate: no pause starts from now on (a hold in progress ends by itself)."""
        self.save_request = None
        if self.state in (PauseState.RUNNING, PauseState.SAVE_REQUESTED):
            self._enter(PauseState.STOPPED)

    # -- the hold --------------------------------------------------------------------------------
    def hold(self, step: int, info: PauseInfo | None = None) -> None:
        """Block the training thread until ``resume`` (or ``terminate``), heartbeating as
        paused and applying other commands (lower_lr...) meanwhile."""
        state, inbox = self._run_state, self._inbox
        info = info or PauseInfo(step, "", "", None)
        self._info = info
        self._enter(PauseState.HELD)
        started = time.monotonic()
        resumed = False
        resume_command: Command | None = None
        try:
            while not (state.finished or state.stopping or resumed):
                command = inbox.take()
                if command is None:
                    inbox.wait(HOLD_POLL_SECONDS)
                elif command.kind == "resume":
                    resumed = self._resume(command, step, started)
                    resume_command = command
                else:
                    self.commands.apply(command, step)
        finally:
            self._info = None
            stopped = state.finished or state.stopping
            self._enter(PauseState.STOPPED if stopped else PauseState.RUNNING)
            self._pace.restart()  # the steps after a hold warm up again
        if resumed:
            self._acts.call_hooks("resume", info)
            # The console diffs it against the snapshot of the checkpoint resumed from: the
            # one the resume rolled back to, else the one this pause saved.
            rolled_back_to = resume_command.params.get("checkpoint") if resume_command else None
            resumed_from = rolled_back_to or info.checkpoint
            if resumed_from is not None:
                self._acts.announce_resume(resumed_from)

    def _resume(self, command: Command, step: int, held_since: float) -> bool:
        """End the hold: your resume handler first (it may refuse by raising), then the roll
        back the command names, if any. False (still held) when either fails."""
        paused_seconds = round(time.monotonic() - held_since, 3)
        try:
            mine = self.commands.apply_own(command, step)
            done_by_handler = isinstance(mine, dict) and "rolled_back" in mine
            wanted = command.params.get("checkpoint") and not done_by_handler
            restored = self._acts.roll_back(command.params) if wanted else {}
        except Exception as error:  # CommandFailed or not: the run stays paused, and says so
            result = error.result if isinstance(error, CommandFailed) else {}
            text = str(error)
            if not isinstance(error, CommandFailed):
                text = f"{type(error).__name__}: {error}"
            self._acks.ack(command.id, "failed", {**result, "step": step, "paused": True}, text)
            return False
        self.data_paused = False
        if mine is not ACK_LATER:  # ACK_LATER: your handler acknowledges it itself
            extra = mine if isinstance(mine, dict) else {}
            self._acks.ack(
                command.id,
                "succeeded",
                {**extra, "step": step, "paused_seconds": paused_seconds, **restored},
            )
        return True
