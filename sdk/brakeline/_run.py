"""The Run: what a training process holds to talk to the console.

Threads: the *training thread* calls log, step_boundary, watch, wrap_loader, checkpoint and the
pause/terminate machinery; three daemon threads (metrics sender, control loop, push listener)
only move data between the network, the spool and the command inbox. Attributes the background
threads read (``step``, ``status``, ``_progress``) are single assignments of immutable values,
atomic under the GIL, so the training thread never takes a lock on its fast path.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from brakeline import _handlers as handlers
from brakeline._backoff import Backoff
from brakeline._checkpoint import (
    CheckpointResult,
    IncompleteCheckpointSet,
    Saver,
    TrainingObjects,
    checkpoint_path,
    gather_set,
    restore,
    save_atomically,
    sha256_of,
    shard_to_restore,
)
from brakeline._commands import ACK_LATER, Command, CommandFailed, CommandInbox
from brakeline._control import ControlLoop
from brakeline._encoding import LogRecord, to_jsonable
from brakeline._exit import (
    exit_if_terminated,
    launcher_fields,
    leave_terminated,
    terminate_exit_code,
    write_marker,
)
from brakeline._guard import StepGuard
from brakeline._loader import PausableLoader
from brakeline._pause import PauseController, PauseInfo, PauseState
from brakeline._push import PushListener
from brakeline._rng import seed_everything
from brakeline._sender import MetricsSender
from brakeline._settings import Settings, resolve_settings
from brakeline._spool import PointSpool, open_spill_directory
from brakeline._transport import HttpTransport, Transport, encode_json
from brakeline.snapshot import (
    checkpoint_contents,
    checkpoint_reference,
    heartbeat_scheduler_fields,
    take_snapshot,
)

logger = logging.getLogger("brakeline")

STATUSES = ("running", "paused", "checkpointing", "finished")
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
        return value.detach().item()
    return value.detach().clone()


def world_size_field(environ: Mapping[str, str], rank: int) -> dict[str, int]:
    """``{"world_size": N}`` from WORLD_SIZE (torchrun, many launchers), or nothing when it is
    unset or unusable: the console refuses a heartbeat whose world size is not above its rank,
    and a stray variable must not cost the run its heartbeats."""
    value = environ.get("WORLD_SIZE", "").strip()
    if not value.isdigit() or not 0 <= rank < int(value) < 2**31:
        return {}
    return {"world_size": int(value)}


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
        self.step = 0
        self.status = "running"
        self.finished = False
        # Set by terminate: a framework is stopping gracefully; no more pausing or holding.
        self.stopping = False
        # Every pause (pause_data, checkpoint_and_pause, a framework's own save) goes through it.
        self._pause = PauseController(self)
        # Keeps non-finite updates out of the weights (watched optimizers, run.guard(loss)).
        self._guard = StepGuard(lambda: self.step + 1)
        self._guard.enabled = settings.guard
        self._logs_with_command_waiting = 0
        self._skip_steps: set[int] = set()
        self.inbox = CommandInbox()
        self.training = TrainingObjects(seeds=dict(seeds or {}))
        self.wrapped_loaders: list[PausableLoader] = []
        self.acknowledgements: list[dict[str, Any]] = []
        self.last_checkpoint: CheckpointResult | None = None
        self.hostname = socket.gethostname()
        # Read once: the scheduler context of a process does not change while it runs.
        self.scheduler_fields = heartbeat_scheduler_fields(os.environ)
        self._world_size = world_size_field(os.environ, settings.rank)
        self._launcher = launcher_fields(os.environ)  # whom the executor stops (brakeline._exit)
        # A forked child (os.fork, fork-started workers) inherits this object but not its
        # threads; it must never finish the parent's run (final "finished" heartbeat, spill).
        self._owner_pid = os.getpid()
        self._exit_function = exit_function or default_exit
        self._progress = 0
        self._progress_at_heartbeat = -1
        self._stepping = False
        self._counters: list[Any] = []
        self._counted_models: set[int] = set()
        self._saver: Saver | None = None
        self._saver_suffix = ".pt"
        self._handlers: dict[str, handlers.Handler] = {}
        # Your handler's result for a command whose built-in behaviour acknowledges it.
        self.handler_results: dict[str, dict[str, Any]] = {}
        self._hooks: dict[str, list[Callable[[PauseInfo], Any]]] = {name: [] for name in HOOK_NAMES}
        self._terminate_handler: Callable[[int], Any] | None = None
        self._snapshots_sent = 0
        self._snapshot_threads: list[threading.Thread] = []
        self._spill_lock: Any = None
        self.sender: MetricsSender | None = None
        self.control: ControlLoop | None = None
        self.push: PushListener | None = None
        self._connect(transport)
        atexit.register(self._finish_at_exit)

    # -- wiring ----------------------------------------------------------------------------------
    def _connect(self, transport: Transport | None) -> None:
        settings = self.settings
        if transport is None and settings.enabled:
            transport = HttpTransport(settings.url, settings.token, settings.http_timeout)
        if transport is None:
            logger.warning(
                "brakeline: no console configured (BRAKELINE_URL, BRAKELINE_TOKEN); "
                "running offline: metrics are not sent, no commands arrive"
            )
            return
        self.sender = MetricsSender(
            transport,
            self._open_spool(),
            settings.node,
            self.inbox.offer_all,
            flush_interval=settings.flush_interval,
            max_queue_records=settings.max_queue_records,
            backoff=Backoff(settings.backoff_base, settings.backoff_cap),
            max_retry_after=settings.max_retry_after,
        )
        self.control = ControlLoop(
            transport,
            self.inbox,
            self._heartbeat_body,
            settings.heartbeat_interval,
            backoff=Backoff(settings.backoff_base, settings.backoff_cap),
        )
        if settings.use_websocket and settings.enabled:
            # The run's backoff cap, not a fixed minute: after a console restart the push
            # channel is back as soon as metrics and heartbeats are.
            self.push = PushListener(
                settings.websocket_url,
                settings.token,
                self.inbox,
                open_timeout=settings.http_timeout,
                backoff=Backoff(settings.backoff_base, settings.backoff_cap),
            )
        self.sender.start()
        self.control.start()
        if self.push is not None:
            self.push.start()
        self.send_snapshot("start", self.step, data_position=None)

    def _open_spool(self) -> PointSpool:
        settings = self.settings
        try:
            directory, self._spill_lock = open_spill_directory(
                settings.spill_dir, settings.job, settings.rank
            )
        except OSError as error:
            directory = Path(tempfile.mkdtemp(prefix="brakeline-spill-"))
            logger.warning("brakeline: spill folder unusable (%s); using %s", error, directory)
        return PointSpool(
            directory,
            settings.batch_points,
            settings.batch_bytes,
            settings.max_memory_points,
            settings.max_spill_bytes,
        )

    def _heartbeat_body(self) -> dict[str, Any] | None:
        # Runs in the control thread. After the first step a "running" heartbeat needs training
        # progress since the previous one, so a hung loop turns into a heartbeat timeout.
        progress = self._progress
        if (
            self.settings.heartbeat_requires_progress
            and self._stepping
            and self.status == "running"
            and progress == self._progress_at_heartbeat
        ):
            return None
        self._progress_at_heartbeat = progress
        return {
            "step": self.step,
            "status": self.status,
            "pid": os.getpid(),
            "hostname": self.hostname,
            "rank": self.settings.rank,
            **self._world_size,
            **self._launcher,
            **self.scheduler_fields,
        }

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
        for optimizer in self.training.optimizers:
            self._guard.watch_optimizer(optimizer)
        for one in self.training.schedulers:
            self._guard.watch_scheduler(one)
        guarded = self._guard.enabled and self.training.optimizers
        if self._guard.weights_step is None and guarded:
            self._guard.weights_step = self.step
        if model is not None and count_nonfinite:
            from brakeline.torch import NonFiniteCounter

            for one in model if isinstance(model, (list, tuple)) else [model]:
                if id(one) not in self._counted_models:  # watch() again must not count twice
                    self._counted_models.add(id(one))
                    self._counters.append(NonFiniteCounter(one))
        return self

    def guard(self, loss: Any) -> Any:
        """Refuse this step's optimizer update if ``loss`` is NaN/±Inf (call it before
        ``optimizer.step()``; gradients are checked anyway). Returns ``loss`` unchanged."""
        try:
            self._guard.guard_loss(loss)
        except Exception:  # the guard must never break training
            logger.exception("brakeline: run.guard failed (loss not checked)")
        return loss

    def add_nonfinite_counter(self, counter: Any) -> None:
        """Use a counter built by hand (e.g. ``NonFiniteCounter(model, gradients=False)``)."""
        self._counters.append(counter)

    def wrap_loader(self, loader: Iterable[Any]) -> PausableLoader:
        """Wrap a data loader: it tracks its position and stops yielding during pause_data."""
        wrapped = PausableLoader(loader, before_fetch=self._before_fetch, skip=self._skip_batch)
        self.wrapped_loaders.append(wrapped)
        self.training.loader = wrapped
        return wrapped

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
        self._saver = saver
        self._saver_suffix = suffix

    def on_command(self, kind: str, handler: handlers.Handler) -> None:
        """Add your own handling to a command kind: ``handler(run, command, step)`` runs first,
        then the built-in behaviour (see docs/sdk.md "Your own handlers"). It returns a dict
        (merged into the ack), raises (ack failed, nothing else happens) or returns
        ``ACK_LATER`` (it takes the command over and acknowledges itself)."""
        self._handlers[kind] = handler

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
        if self.sender is None or self.finished:
            return
        try:
            if step is None:
                step = self.step
            elif not self._stepping:
                self.step = step
            record = LogRecord(
                step=step,
                time=time.time(),
                metrics={name: _capture(v) for name, v in metrics.items()},
            )
            self._attach_nonfinite_counts(record)
            self.sender.submit(record)
            if self.inbox.has_pending:
                self._note_command_waiting()
        except Exception:  # logging must never break training
            logger.exception("brakeline: run.log failed (metrics skipped)")

    def _note_command_waiting(self) -> None:
        # Metrics flow while a delivered command is never applied: step_boundary is missing
        # from the loop. Said once per waiting stretch, loudly, long before an executor acts.
        self._logs_with_command_waiting += 1
        if self._logs_with_command_waiting == self.settings.unapplied_command_logs:
            logger.error(
                "brakeline: a console command has waited through %d run.log calls without "
                "being applied: is run.step_boundary(step) called in your training loop? "
                "Commands are applied only there (or while a wrapped loader fetches).",
                self._logs_with_command_waiting,
            )

    def _attach_nonfinite_counts(self, record: LogRecord) -> None:
        for counter in self._counters:
            losses, observed, gradients = counter.take()
            # Counts may be device tensors: add them without reading (no sync here).
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

    def step_boundary(self, step: int | None = None) -> None:
        """Call once per step, after optimizer.step(): commands are applied here, and only here
        (or while a wrapped loader waits for its next batch)."""
        self.step = self.step + 1 if step is None else step
        self._progress += 1
        self._stepping = True
        if self._guard.tripped_step is not None:
            self._hold_for_decision(self._guard.take_trip())
        if self.inbox.has_pending:
            self._process_commands(self.step)

    def _hold_for_decision(self, tripped: int | None) -> None:
        """The guard skipped a non-finite update: send the point now and let the console's
        rules decide (normally checkpoint_and_pause, which saves this last good state)."""
        if self.control is None or self.finished or self.stopping:
            return  # offline: the skipped update is all the guard can do
        if self.sender is not None:
            # Said in so many words: a NaN gradient need not show in any logged metric. The
            # default rule pack brakes on it (update-refused-by-guard, L3).
            self.sender.submit(
                LogRecord(
                    step=tripped if tripped is not None else self.step,
                    time=time.time(),
                    metrics={"guard.skipped_updates": float(self._guard.refused_count())},
                )
            )
        self.flush(min(self.settings.guard_hold_seconds, self.settings.http_timeout))
        deadline = time.monotonic() + self.settings.guard_hold_seconds
        while not (self.finished or self.inbox.has_pending):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                logger.error(
                    "brakeline: no console decision %.0f s after the non-finite step %s; "
                    "training goes on (that update was skipped)",
                    self.settings.guard_hold_seconds,
                    tripped,
                )
                return
            self.keepalive()  # held on purpose: heartbeats must not turn this into a hang
            self.inbox.wait(min(remaining, 0.25))

    def keepalive(self) -> None:
        """Count as progress during long phases without steps (evaluation, data warm-up)."""
        self._progress += 1

    def _before_fetch(self) -> None:
        if self.inbox.has_pending:
            self._process_commands(self.step)
        pause = self._pause
        held = self.finished or self.stopping or pause.state is not PauseState.RUNNING
        if pause.data_paused and not held:
            pause.hold(self.step)

    def _process_commands(self, step: int) -> None:
        # A save the framework makes in a later hook leaves the commands behind it (its
        # resume) in the inbox, for that pause's hold to take.
        while not (self.finished or self._pause.state is PauseState.SAVE_REQUESTED):
            command = self.inbox.take()
            if command is None:
                return
            self._logs_with_command_waiting = 0
            self._apply(command, step)

    def _apply(self, command: Command, step: int) -> None:
        handler = handlers.composed(self._handlers.get(command.kind), command.kind)
        logger.warning(
            "brakeline: applying %s (command %s, %s) at step %d: %s",
            command.kind,
            command.id,
            command.severity or "-",
            step,
            command.reason,
        )
        try:
            result = handler(self, command, step)
        except CommandFailed as failure:
            self.ack(command.id, "failed", failure.result, str(failure))
        except Exception as error:  # a failing command must not kill training
            logger.exception("brakeline: command %s failed", command.kind)
            self.ack(command.id, "failed", {"step": step}, f"{type(error).__name__}: {error}")
        else:
            if result is not ACK_LATER:
                self.ack(command.id, "succeeded", result if isinstance(result, dict) else {})

    # -- pause, checkpoint, terminate ------------------------------------------------------------
    def set_status(self, status: str) -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}")
        self.status = status
        if self.control is not None:
            self.control.poke()

    @property
    def pause_state(self) -> PauseState:
        """Where the run is in its pause sequence (RUNNING unless a pause is under way)."""
        return self._pause.state

    @property
    def paused(self) -> bool:
        """True while the training thread is held (pause_data, checkpoint_and_pause)."""
        return self._pause.state is PauseState.HELD

    def checkpoint(self, step: int | None = None, reason: str = "manual") -> CheckpointResult:
        """Save a checkpoint now (training thread, between steps) with the registered saver or
        the default torch saver; atomic, fsynced, hashed. Also sends a checkpoint snapshot."""
        step = self.step if step is None else step
        saver = self._saver
        if saver is None and not self.training.empty:
            saver = self.training.torch_saver
        if saver is None:
            raise RuntimeError(
                "nothing to checkpoint: call run.watch(model=..., optimizer=...) "
                "or run.set_saver(...)"
            )
        path = checkpoint_path(
            self.settings.checkpoint_dir, step, self.settings.rank, self._saver_suffix
        )
        previous_status = self.status
        # Heartbeats say "checkpointing" during a long save, so it is not taken for a hang.
        self.set_status("checkpointing")
        try:
            result = save_atomically(path, step, saver)
        finally:
            self.set_status(previous_status)
        result.reason = reason
        # Which updates the saved weights hold, as far as the guard of the watched optimizers
        # knows (the console marks the checkpoint clean or "after the anomaly" by it).
        result.weights_step = self._guard.weights_step
        if self.settings.checkpoint_sets:  # collective: rank 0 writes the set's manifest
            found = gather_set(result, self.settings.checkpoint_dir)
            result.set = found.as_report() if found is not None else None
        self.last_checkpoint = result
        self._report_checkpoint(result)
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
        path, expected, skip = _roll_back_params(params)
        try:  # a set: this rank's shard, once the manifest and every shard check out
            path, expected = shard_to_restore(params, self.settings.rank) or (path, expected)
        except IncompleteCheckpointSet as error:
            raise CommandFailed(str(error), {"rank": error.rank}) from None
        if self._saver is not None or self.training.empty:
            raise CommandFailed(
                "roll back in place restores the SDK's default checkpoints of watched objects; "
                "with your own saver, restore in a resume handler (run.on_command('resume', "
                "...)) that returns {'rolled_back': True, 'restored_step': ..., 'sha256': ...}"
            )
        try:
            actual = sha256_of(path)
        except OSError as error:
            raise CommandFailed(f"checkpoint {path} cannot be read: {error}") from None
        if expected is not None and actual != expected:
            raise CommandFailed(f"checkpoint {path} has sha256 {actual}, not {expected}")
        training = self.training
        try:
            state = restore(
                path,
                model=training.models,
                optimizer=training.optimizers,
                scheduler=training.schedulers,
                loader=training.loader,
                stateful=training.stateful,
            )
        except Exception as error:
            why = f"{type(error).__name__}: {error}"
            raise CommandFailed(f"restoring {path} failed: {why}") from None
        self.step = state.step
        self._guard.weights_step = state.step
        self._skip_steps = {s for s in skip if s > state.step}
        logger.warning("brakeline: rolled back to %s (step %d)", path, state.step)
        return {
            "rolled_back": True,
            "restored_step": state.step,
            "path": str(path),
            "sha256": actual,
            "skip_steps": sorted(self._skip_steps),
        }

    def _skip_batch(self) -> bool:
        """A wrapped loader asks before yielding: is the next step's batch one to drop?"""
        if not self._skip_steps or (self.step + 1) not in self._skip_steps:
            return False
        self._skip_steps.discard(self.step + 1)
        self.step += 1  # that step happens without training: no update, no log
        logger.warning("brakeline: skipped the batch of step %d (roll back)", self.step)
        return True

    def _report_checkpoint(self, result: CheckpointResult) -> None:
        # The console's catalogue: what a roll back may name, marked clean or not by it.
        if self.control is None:
            return
        body = {
            key: value
            for key, value in result.as_dict().items()
            if key in ("path", "sha256", "step", "bytes", "reason", "weights_step", "set")
        }
        body["rank"] = self.settings.rank
        encoded = encode_json(to_jsonable(body))
        self.control.enqueue(f"checkpoint:{result.sha256}", "checkpoints", lambda: encoded)

    def terminate(self, command: Command, step: int) -> None:
        """Flush, acknowledge, finish and exit with EXIT_TERMINATED (or hand over to the
        framework's graceful stop when a terminate handler is set)."""
        result = {"step": step, "exit_code": terminate_exit_code(os.environ)}
        # Before anything else: a relaunch of this launch must find it (brakeline._exit).
        write_marker(self.settings.checkpoint_dir, os.environ, command.id, step, self.settings.rank)
        self.stopping = True
        self._pause.stop()
        if self._terminate_handler is not None:
            self.ack(command.id, "succeeded", {**result, "graceful_stop": True})
            self._terminate_handler(step)
            return
        self.flush(self.settings.finish_timeout / 2)
        self.ack(command.id, "succeeded", result)
        self.finish_terminated()

    def finish_terminated(self) -> None:
        """Finish the run and leave the process with EXIT_TERMINATED (0 under torchrun)."""
        self.finish()
        leave_terminated(self._launcher, os.environ, self._exit_function)  # brakeline._exit

    def call_hooks(self, name: str, info: PauseInfo) -> None:
        for callback in self._hooks[name]:
            try:
                callback(info)
            except Exception:  # a broken hook must not lose the pause
                logger.exception("brakeline: %s callback failed", name)

    # -- console traffic -------------------------------------------------------------------------
    def ack(
        self,
        command_id: int | str,
        status: str,
        result: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        """Acknowledge a command (queued; delivered by the control thread with retries)."""
        merged = {**self.handler_results.pop(str(command_id), {}), **dict(result or {})}
        body: dict[str, Any] = {"status": status, "result": to_jsonable(merged)}
        if error:
            body["error"] = error
        payload = encode_json(body)
        self.acknowledgements.append({"id": command_id, **body})
        log = logger.info if status == "succeeded" else logger.warning
        log("brakeline: command %s %s %s", command_id, status, error or "")
        if self.control is not None:
            self.control.enqueue(
                f"ack:{command_id}", f"commands/{command_id}/ack", lambda: payload, urgent=True
            )

    def wait_for_ack(self, command_id: int | str) -> bool:
        """Wait (bounded) until the console has the acknowledgement; True if it does."""
        if self.control is None:
            return False
        return self.control.wait_delivered(
            f"ack:{command_id}", self.settings.ack_wait_before_release
        )

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
        if self.control is None or not self.settings.send_snapshots:
            return
        if kind in ("checkpoint", "resume") and checkpoint is None:
            raise ValueError(f"a {kind} snapshot needs the checkpoint (result or path)")
        self._snapshots_sent += 1
        key = f"snapshot:{kind}:{step}:{self._snapshots_sent}"
        seeds = dict(self.training.seeds)
        loader = self.training.loader
        holds = checkpoint_contents(self.training, bool(self._saver), kind)
        settings = self.settings
        control = self.control

        def build_and_queue() -> None:
            # A thread of its own: scanning packages takes a tenth of a second or more, which
            # must delay neither training nor heartbeats and acknowledgements.
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
                encoded = encode_json(to_jsonable(body))
            except Exception:
                logger.exception("brakeline: environment snapshot failed")
                return
            control.enqueue(key, "snapshots", lambda: encoded)

        thread = threading.Thread(target=build_and_queue, name="brakeline-snapshot", daemon=True)
        self._snapshot_threads.append(thread)
        thread.start()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued metrics are delivered (bounded); True if nothing is pending."""
        if self.sender is None:
            return True
        return self.sender.flush(self.settings.finish_timeout if timeout is None else timeout)

    def finish(self, timeout: float | None = None) -> None:
        """Deliver what can be delivered, send the final heartbeat, stop the threads.
        Undelivered metrics stay in the spill folder and are replayed by the next start."""
        if self.finished or os.getpid() != self._owner_pid:
            return
        self.finished = True
        self.status = "finished"
        self.inbox.wake()
        timeout = self.settings.finish_timeout if timeout is None else timeout
        if self.sender is not None:
            self.sender.stop(timeout / 2)
        if self.control is not None:
            for thread in self._snapshot_threads:
                thread.join(timeout=1.0)
            self.control.poke()
            self.control.stop(timeout / 2)
        if self.push is not None:
            self.push.stop()
        for counter in self._counters:
            counter.detach()
        if self._spill_lock is not None:
            self._spill_lock.close()
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


def _roll_back_params(params: Mapping[str, Any]) -> tuple[Path, str | None, list[int]]:
    path, expected, skip = params.get("checkpoint"), params.get("sha256"), params.get("skip_steps")
    if not isinstance(path, str) or not path:
        raise CommandFailed("roll back needs params.checkpoint, the checkpoint's path")
    if expected is not None and not isinstance(expected, str):
        raise CommandFailed("params.sha256 must be the checkpoint's hex SHA-256")
    skip = [] if skip is None else skip
    if not isinstance(skip, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in skip
    ):
        raise CommandFailed("params.skip_steps must be a list of step numbers")
    return Path(path), expected, skip


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
