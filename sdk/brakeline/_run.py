"""The Run: what a training process holds to talk to the console.

Threads: the *training thread* calls log, step_boundary, watch, wrap_loader, checkpoint and the
pause/terminate machinery; the link's daemon threads (brakeline._link) only move data between
the network, the spool and the command inbox, and read the run's state (brakeline._state) to
build heartbeats.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brakeline import _handlers as handlers
from brakeline._acks import Acknowledgements
from brakeline._checkpoint import (
    CheckpointResult,
    Saver,
    TrainingObjects,
)
from brakeline._commands import Command, CommandInbox
from brakeline._control import ControlLoop
from brakeline._counts import NonFiniteCounts
from brakeline._drill import DrillFaults, note_release
from brakeline._encoding import LogRecord, to_jsonable
from brakeline._exit import (
    exit_if_terminated,
    leave_terminated,
    terminate_exit_code,
    write_marker,
)
from brakeline._framework import FrameworkRun
from brakeline._guard import StepGuard
from brakeline._hold import GuardHold
from brakeline._link import PushChannel, open_link
from brakeline._loader import PausableLoader
from brakeline._pace import StepPace
from brakeline._pause import PauseController, PauseInfo, PauseState, RunActs
from brakeline._ranksync import BoundaryCommands, RankAgreement
from brakeline._rng import seed_everything
from brakeline._rollback import Checkpoints
from brakeline._sender import MetricsSender
from brakeline._settings import Settings, resolve_settings
from brakeline._state import STATUSES, HeartbeatBody, RunState
from brakeline._transport import Transport, encode_json
from brakeline.snapshot import (
    checkpoint_contents,
    checkpoint_reference,
    send_resume_snapshot,
    take_snapshot,
)

if TYPE_CHECKING:
    from brakeline.torch import NonFiniteCounter

logger = logging.getLogger("brakeline")

HOOK_NAMES = ("release", "resume")


def default_exit(code: int) -> None:
    """sys.exit in the main thread (finally blocks run); os._exit elsewhere, where sys.exit
    would only end the calling thread. The run is already finished when this is called."""
    if threading.current_thread() is threading.main_thread():
        sys.exit(code)
    logging.shutdown()
    os._exit(code)


def _capture(value: Any) -> Any:
    # Tensors are copied on their device (no sync) and read later by the sender thread, so a
    # logged tensor changed in place afterwards still reports the value it had here. A CPU
    # scalar is read at once instead: there is no device to wait for, and item() costs a
    # fraction of a clone (bench/sdk_overhead.py).
    if isinstance(value, (int, float)) or not hasattr(value, "detach"):
        return value
    if getattr(value, "is_cpu", False) and value.numel() == 1:
        return value.item()  # item() needs no detach: it copies the value out
    return value.detach().clone()


class Run:
    """One training process's connection to the console. Create it with :func:`init`."""

    def __init__(
        self,
        settings: Settings,
        transport: Transport | None = None,
        exit_function: Callable[[int], Any] | None = None,
        seeds: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self._state = RunState()
        self.inbox = CommandInbox()
        self.training = TrainingObjects(seeds=dict(seeds or {}))
        self.wrapped_loaders: list[PausableLoader] = []
        # Its own compute time per step, and the gradient sync it entered (brakeline._pace).
        self._pace = StepPace(self._state.next_step)
        heartbeat = HeartbeatBody(settings, self._state, self._pace, os.environ)
        self.hostname = heartbeat.hostname
        self.scheduler_fields = heartbeat.scheduler_fields
        self._launcher = heartbeat.launcher  # whom the executor stops (brakeline._exit)
        self._link = open_link(settings, self.inbox, heartbeat, heartbeat.multi_rank, transport)
        self._acks = Acknowledgements(
            self._link, settings.rank, heartbeat.multi_rank, settings.ack_wait_before_release
        )
        self._compose_training(settings)
        self._compose_commands(settings)
        # A forked child (os.fork, fork-started workers) inherits this object but not its
        # threads; it must never finish the parent's run (final "finished" heartbeat, spill).
        self._owner_pid = os.getpid()
        self._exit_function = exit_function or default_exit
        self._hooks: dict[str, list[Callable[[PauseInfo], Any]]] = {name: [] for name in HOOK_NAMES}
        self._terminate_handler: Callable[[int], Any] | None = None
        self._link.start()
        self.send_snapshot("start", self.step, data_position=None)
        atexit.register(self._finish_at_exit)

    def _compose_training(self, settings: Settings) -> None:
        """The parts that act on the training objects: the step guard (keeps non-finite
        updates out of the weights), its counts and its hold, checkpoints and roll back."""
        self._guard = StepGuard(self._state.next_step, settings.guard_device)
        self._guard.enabled = settings.guard
        self._guard.rerun.enabled = settings.rerun_nonfinite
        self._guard.rerun.models = lambda: self.training.models
        self._nonfinite = NonFiniteCounts(self._guard)
        self._hold = GuardHold(settings, self._state, self._link, self.inbox, self._guard)
        self._checkpoints = Checkpoints(
            settings,
            self._state,
            self.training,
            self._guard,
            self._pace,
            self._link,
            self.set_status,
        )

    def _compose_commands(self, settings: Settings) -> None:
        """The parts that obey the console: every pause (pause_data, checkpoint_and_pause, a
        framework's own save) goes through the pause controller; a fire drill's faults are
        planned on this run's models; commands are applied at the boundary, after the ranks'
        agreement where a process group exists."""
        acts = RunActs(
            self.set_status, self.call_hooks, self.roll_back, partial(send_resume_snapshot, self)
        )
        self._pause = PauseController(
            self._state, self.inbox, self._acks, self._pace, self.wrapped_loaders, acts
        )
        #: What a framework's integration (brakeline.integrations) reports to the run.
        self.framework = FrameworkRun(self._state, self._guard, self._pause)
        self._drill = DrillFaults(self)
        agreement = RankAgreement(settings.rank_agreement, settings.agreement_every)
        self._commands = BoundaryCommands(
            self,
            settings,
            self._state,
            self.inbox,
            self._acks,
            agreement,
            self._pause,
            self._drill,
            self._link.poke,
        )
        self._pause.commands = self._commands  # a hold applies what arrives meanwhile

    # -- the run's state, as users and frameworks read it ------------------------------------------
    @property
    def step(self) -> int:
        """The last step boundary's step (set it after restoring a checkpoint yourself)."""
        return self._state.step

    @step.setter
    def step(self, value: int) -> None:
        self._state.step = value

    @property
    def status(self) -> str:
        """What the heartbeats say: running, paused, checkpointing, holding or finished."""
        return self._state.status

    @status.setter
    def status(self, value: str) -> None:
        self._state.status = value

    @property
    def finished(self) -> bool:
        return self._state.finished

    @property
    def stopping(self) -> bool:
        """Terminated: a framework is stopping gracefully; no more pausing or holding."""
        return self._state.stopping

    @property
    def sender(self) -> MetricsSender | None:
        """The metrics sender (None offline): its spool and counters tell what was dropped."""
        return self._link.sender

    @property
    def control(self) -> ControlLoop | None:
        return self._link.control

    @property
    def push(self) -> PushChannel | None:
        return self._link.push

    @property
    def acknowledgements(self) -> list[dict[str, Any]]:
        """Every acknowledgement this run sent, in order."""
        return self._acks.sent

    @property
    def handler_results(self) -> dict[str, dict[str, Any]]:
        """Your handler's result for a command whose built-in behaviour acknowledges it."""
        return self._acks.handler_results

    # -- registration ----------------------------------------------------------------------------
    def watch(
        self,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        stateful: Mapping[str, Any] | None = None,
        count_nonfinite: bool = True,
    ) -> Run:
        """Register what commands act on and checkpoints hold (each argument: one or a list).

        With a model and ``count_nonfinite``, a :class:`brakeline.torch.NonFiniteCounter` is
        attached so every ``log`` carries ``nonfinite.loss`` / ``nonfinite.grad``.
        """
        for name, value in (
            ("models", model),
            ("optimizers", optimizer),
            ("schedulers", scheduler),
        ):
            registered = getattr(self.training, name)
            values = value if isinstance(value, (list, tuple)) else [value]
            registered.extend(v for v in values if v is not None and v not in registered)
        self.training.stateful.update(stateful or {})
        training = self.training
        guarded = self._guard.watch(training.optimizers, training.schedulers, self.step)
        if model is not None and count_nonfinite:
            for one in model if isinstance(model, (list, tuple)) else [model]:
                if self.settings.time_sync:
                    self._pace.hook(one)
                self._nonfinite.count(one, guarded)
        return self

    def wrap_loader(self, loader: Iterable[Any]) -> PausableLoader:
        """Wrap a data loader: it tracks its position and stops yielding during pause_data."""
        wrapped = PausableLoader(
            loader, before_fetch=self._before_fetch, skip=self._checkpoints.skip_batch
        )
        self.wrapped_loaders.append(wrapped)
        self.training.loader = wrapped
        return wrapped

    def add_nonfinite_counter(self, counter: NonFiniteCounter) -> None:
        """Use a counter built by hand (e.g. ``NonFiniteCounter(model, gradients=False)``)."""
        self._nonfinite.add(counter)

    def register_seed(self, name: str, value: Any) -> None:
        self.training.seeds[name] = value

    def seed(self, value: int) -> dict[str, int]:
        """Seed Python, NumPy and torch with ``value`` and record it in snapshots/checkpoints."""
        seeded = seed_everything(value)
        self.training.seeds.update(seeded)
        return seeded

    def set_saver(self, saver: Saver, suffix: str = ".pt") -> None:
        """Replace the default torch saver: ``saver(path, step)`` writes a file or a folder at
        ``path`` (a temporary name; brakeline fsyncs, renames atomically and hashes it)."""
        self._checkpoints.set_saver(saver, suffix)

    def on_command(self, kind: str, handler: handlers.Handler[Run]) -> None:
        """Add your own handling to a command kind: ``handler(run, command, step)`` runs first,
        then the built-in behaviour (see docs/sdk.md "Your own handlers"). It returns a dict
        (merged into the ack), raises (ack failed, nothing else happens) or returns
        ``ACK_LATER`` (it takes the command over and acknowledges itself)."""
        self._commands.handlers[kind] = handler

    def on_release(self, callback: Callable[[PauseInfo], Any]) -> None:
        """Called after a checkpoint_and_pause saved and confirmed: free accelerators here."""
        self._hooks["release"].append(callback)

    def on_resume(self, callback: Callable[[PauseInfo], Any]) -> None:
        """Called when a pause ends with resume, before training continues."""
        self._hooks["resume"].append(callback)

    def set_terminate_handler(self, handler: Callable[[int], Any] | None) -> None:
        """Frameworks: on terminate, call ``handler(step)`` to stop gracefully instead of
        exiting at once; then call :meth:`finish_terminated` when the framework has stopped."""
        self._terminate_handler = handler

    # -- the training loop's calls ---------------------------------------------------------------
    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Queue metrics for the console; returns in microseconds, never blocks or raises."""
        state = self._state
        if not self._link.online or state.finished:
            return
        try:
            if step is None:
                step = state.step
            elif not state.stepping:
                state.step = step
            record = LogRecord(
                step=step,
                time=time.time(),
                metrics={
                    name: v if type(v) is float else _capture(v) for name, v in metrics.items()
                },
            )
            self._nonfinite.attach_to(record)
            self._link.submit(record)
            if self.inbox.has_pending and self.inbox.has_due(state.step):
                self._commands.note_waiting()
        except Exception:  # logging must never break training
            logger.exception("brakeline: run.log failed (metrics skipped)")

    def step_boundary(self, step: int | None = None) -> None:
        """Call once per step, after optimizer.step(): commands are applied here, and only here
        (or while a wrapped loader waits for its next batch)."""
        state = self._state
        self._pace.step_ended()
        state.step = state.step + 1 if step is None else step
        state.progress += 1
        state.stepping = True
        self._hold.at_boundary()
        self._commands.at_boundary(state.step)
        self._pace.step_started()  # what the boundary did is not the next step's work

    def guard(self, loss: Any) -> Any:
        """Refuse this step's optimizer update if ``loss`` is NaN/±Inf (call it before
        ``optimizer.step()``; gradients are checked anyway). Returns ``loss`` unchanged."""
        try:
            self._guard.guard_loss(loss)
        except Exception:  # the guard must never break training
            logger.exception("brakeline: run.guard failed (loss not checked)")
        return loss

    def keepalive(self) -> None:
        """Count as progress during long phases without steps (evaluation, data warm-up)."""
        self._state.keepalive()

    def _before_fetch(self) -> None:
        self._commands.at_boundary(self.step, fetching=True)
        pause = self._pause
        held = self.finished or self.stopping or pause.state is not PauseState.RUNNING
        if pause.data_paused and not held:
            pause.hold(self.step)

    # -- pause, checkpoint, terminate ------------------------------------------------------------
    def checkpoint(self, step: int | None = None, reason: str = "manual") -> CheckpointResult:
        """Save a checkpoint now (training thread, between steps) with the registered saver or
        the default torch saver; atomic, fsynced, hashed. Also sends a checkpoint snapshot."""
        step = self.step if step is None else step
        result = self._checkpoints.save(step, reason)
        loader = self.training.loader
        self.send_snapshot("checkpoint", step, loader.position() if loader else None, result)
        return result

    def roll_back(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Restore the named checkpoint into the watched objects, in place (training thread,
        while held): model, optimizer, scheduler, stateful objects, the wrapped loader's
        position and every RNG; then ``run.step`` is the checkpoint's step. Raises
        CommandFailed (the run stays paused) when the checkpoint is not there, not ours, or
        does not match ``sha256``. ``skip_steps``: the batches of these later steps are
        fetched and dropped (the poisoned batch is not trained on again)."""
        return self._checkpoints.roll_back(params)

    @property
    def last_checkpoint(self) -> CheckpointResult | None:
        """The last checkpoint saved (or handed over by a framework's own save)."""
        return self._checkpoints.last

    @last_checkpoint.setter
    def last_checkpoint(self, result: CheckpointResult | None) -> None:
        self._checkpoints.last = result

    def set_status(self, status: str) -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}")
        self._state.status = status
        self._link.poke()

    @property
    def pause_state(self) -> PauseState:
        """Where the run is in its pause sequence (RUNNING unless a pause is under way)."""
        return self._pause.state

    @property
    def paused(self) -> bool:
        """True while the training thread is held (pause_data, checkpoint_and_pause)."""
        return self._pause.state is PauseState.HELD

    def terminate(self, command: Command, step: int) -> None:
        """Flush, acknowledge, finish and exit with EXIT_TERMINATED (or hand over to the
        framework's graceful stop when a terminate handler is set)."""
        result = {"step": step, "exit_code": terminate_exit_code(os.environ)}
        # Before anything else: a relaunch of this launch must find it (brakeline._exit).
        write_marker(self.settings.checkpoint_dir, os.environ, command.id, step, self.settings.rank)
        self._state.stopping = True
        self._pause.stop()
        if self._terminate_handler is not None:
            self.ack(command.id, "succeeded", {**result, "graceful_stop": True})
            self._terminate_handler(step)
            return
        self.flush(self.settings.finish_timeout / 2)
        self.ack(command.id, "succeeded", result)
        self.wait_for_ack(command.id)  # the console hears "terminated" before "finished"
        self.finish_terminated()

    def finish_terminated(self) -> None:
        """Finish the run and leave the process with EXIT_TERMINATED (0 under torchrun)."""
        self.finish()
        leave_terminated(self._launcher, os.environ, self._exit_function)  # brakeline._exit

    def call_hooks(self, name: str, info: PauseInfo) -> None:
        ran = 0
        for callback in self._hooks[name]:
            try:
                callback(info)
                ran += 1
            except Exception:  # a broken hook must not lose the pause
                logger.exception("brakeline: %s callback failed", name)
        if name == "release":
            note_release(ran, info.step)  # a fire drill's release line (brakeline._drill)

    # -- console traffic -------------------------------------------------------------------------
    def ack(
        self,
        command_id: int | str,
        status: str,
        result: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """Acknowledge a command (queued; delivered by the control thread with retries)."""
        self._acks.ack(command_id, status, result, error)

    def wait_for_ack(self, command_id: int | str) -> bool:
        """Wait (bounded) until the console has the acknowledgement; True if it does."""
        return self._acks.wait(command_id)

    def send_snapshot(
        self,
        kind: str,
        step: int,
        data_position: Any = None,
        checkpoint: CheckpointResult | str | Path | None = None,
    ) -> None:
        """Queue an environment snapshot, taken in the background: ``"start"``, or
        ``"checkpoint"`` with the checkpoint it belongs to (a CheckpointResult, or a path that
        is then hashed in the background thread, never in the training thread)."""
        if not self._link.online or not self.settings.send_snapshots:
            return
        if kind in ("checkpoint", "resume") and checkpoint is None:
            raise ValueError(f"a {kind} snapshot needs the checkpoint (result or path)")
        settings = self.settings
        seeds = dict(self.training.seeds)
        loader = self.training.loader
        holds = checkpoint_contents(self.training, self._checkpoints.saver is not None, kind)

        def build() -> bytes | None:
            try:
                snapshot = take_snapshot(
                    rank=settings.rank,
                    node=settings.node,
                    seeds=seeds,
                    data_position=data_position,
                    scratch_dir=settings.checkpoint_dir,
                    loader=loader,
                    checkpoint_holds=holds,
                )
                body: dict[str, Any] = {"kind": kind, "step": step, "snapshot": snapshot}
                if checkpoint is not None:
                    body["checkpoint"] = checkpoint_reference(checkpoint)
                return encode_json(to_jsonable(body))
            except Exception:
                logger.exception("brakeline: environment snapshot failed")
                return None

        self._link.queue_snapshot(kind, step, build)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued metrics are delivered (bounded); True if nothing is pending."""
        return self._link.flush(self.settings.finish_timeout if timeout is None else timeout)

    def finish(self, timeout: float | None = None) -> None:
        """Deliver what can be delivered, send the final heartbeat, stop the threads.
        Undelivered metrics stay in the spill folder and are replayed by the next start."""
        state = self._state
        if state.finished or os.getpid() != self._owner_pid:
            return
        state.finished = True
        state.status = "finished"
        self.inbox.wake()
        self._link.stop(self.settings.finish_timeout if timeout is None else timeout)
        self._nonfinite.detach()
        atexit.unregister(self._finish_at_exit)

    def _finish_at_exit(self) -> None:
        try:
            self.finish(timeout=min(self.settings.finish_timeout, 5.0))
        except Exception:  # never turn interpreter exit into a traceback
            logger.exception("brakeline: finish at exit failed")

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.finish()


#: What the console's local executor looks for in /proc/PID/environ before it signals a process
#: (with BRAKELINE_TOKEN): the token's first 12 characters, which the console shows anyway.
JOB_MARKER_VARIABLE = "BRAKELINE_JOB_MARKER"


def export_job_marker(settings: Settings) -> None:
    """Put the job's marker into ``os.environ``, so the processes this one starts from now on
    (torchrun workers, launched scripts) carry it from their start. This process's own
    /proc/PID/environ does not change: for the console to stop *this* process from outside,
    BRAKELINE_TOKEN (or the marker) must be in its environment when it is started."""
    if settings.token:
        os.environ[JOB_MARKER_VARIABLE] = settings.token[:12]


def init(
    job: str | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    ws_url: str | None = None,
    seeds: Mapping[str, Any] | None = None,
    transport: Transport | None = None,
    exit_function: Callable[[int], Any] | None = None,
    **settings: Any,
) -> Run:
    """Start a run. Unset arguments come from BRAKELINE_* variables; other keyword arguments
    are :class:`brakeline.Settings` fields (heartbeat_interval, flush_interval,
    spill_dir, checkpoint_dir, rank, node, use_websocket...)."""
    resolved = resolve_settings(
        {"job": job, "url": url, "token": token, "ws_url": ws_url, **settings}
    )
    export_job_marker(resolved)
    exit_if_terminated(resolved.checkpoint_dir, os.environ, exit_function or default_exit)
    return Run(resolved, transport=transport, exit_function=exit_function, seeds=seeds)
