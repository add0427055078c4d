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
    Saver,
    TrainingObjects,
)
from brakeline._commands import Command, CommandInbox
from brakeline._control import ControlLoop
from brakeline._drill import note_release
from brakeline._encoding import LogRecord, to_jsonable
from brakeline._exit import (
    exit_if_terminated,
    launcher_fields,
    leave_terminated,
    terminate_exit_code,
    write_marker,
)
from brakeline._guard import GuardedRunMixin, StepGuard
from brakeline._loader import PausableLoader
from brakeline._node import console_links
from brakeline._pace import StepPace
from brakeline._pause import PauseController, PauseInfo, PauseState
from brakeline._ranksync import CommandApplyMixin, RankAgreement
from brakeline._rng import seed_everything
from brakeline._rollback import CheckpointMixin
from brakeline._sender import MetricsSender
from brakeline._settings import Settings, resolve_settings
from brakeline._spool import PointSpool, open_spill_directory
from brakeline._transport import Transport, encode_json
from brakeline.snapshot import (
    checkpoint_contents,
    checkpoint_reference,
    heartbeat_scheduler_fields,
    take_snapshot,
)

logger = logging.getLogger("brakeline")

STATUSES = ("running", "paused", "checkpointing", "finished", "holding")
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


# Where launchers announce the world size, in the order of default_rank's rank variables.
WORLD_SIZE_VARIABLES = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


def world_size_field(environ: Mapping[str, str], rank: int) -> dict[str, int]:
    """``{"world_size": N}`` from WORLD_SIZE (torchrun, many launchers; else Slurm's, Open
    MPI's or PMI's), or nothing when none is set or usable: the console refuses a heartbeat
    whose world size is not above its rank, and a stray variable must not cost the run its
    heartbeats. Every rank knowing it matters: rank 0's acknowledgements too must name their
    rank, or the console would take rank 0's answer for the whole job's."""
    for name in WORLD_SIZE_VARIABLES:
        value = environ.get(name, "").strip()
        if value:
            if not value.isdigit() or not 0 <= rank < int(value) < 2**31:
                return {}
            return {"world_size": int(value)}
    return {}


class Run(CheckpointMixin, GuardedRunMixin, CommandApplyMixin):
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
        self._guard = StepGuard(lambda: self.step + 1, settings.guard_device)
        self._guard.enabled = settings.guard
        self._logs_with_command_waiting = 0
        # Multi-rank jobs: the ranks agree at the boundary where a process group exists.
        self._agreement = RankAgreement(settings.rank_agreement, settings.agreement_every)
        self._applied_at: dict[str, int | None] = {}
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
        self._progress_at_heartbeat: tuple[int, int] = (-1, -1)
        # Its own compute time per step, and the gradient sync it entered (brakeline._pace).
        self._pace = StepPace(lambda: self.step + 1)
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
        self.push: Any = None  # a PushListener, or the node's link (brakeline._node)
        self._connect(transport)
        atexit.register(self._finish_at_exit)

    # -- wiring ----------------------------------------------------------------------------------
    def _connect(self, transport: Transport | None) -> None:
        settings = self.settings
        rank_named = bool(self._world_size or settings.rank)
        transport, self.push = console_links(settings, self.inbox, rank_named, transport)
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
        self.sender.heartbeats = self.control  # a due heartbeat rides in the next batch
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
            rank=settings.rank,
        )

    def _heartbeat_body(self) -> dict[str, Any] | None:
        # Runs in the control thread. After the first step a "running" heartbeat needs training
        # progress since the previous one, so a hung loop turns into a heartbeat timeout.
        # Entering a gradient sync is news too: a rank blocked in one says so, once, before it
        # falls silent, so the console can tell it from the rank it waits for.
        progress = (self._progress, self._pace.entered)
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
            **self._pace.heartbeat_fields(),
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
            for one in model if isinstance(model, (list, tuple)) else [model]:
                if self.settings.time_sync:
                    self._pace.hook(one)
                self._count_nonfinite_of(one, bool(guarded))
        return self

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
                metrics={
                    name: v if type(v) is float else _capture(v) for name, v in metrics.items()
                },
            )
            self._attach_nonfinite_counts(record)
            self.sender.submit(record)
            if self.inbox.has_pending and self.inbox.has_due(self.step):
                self._note_command_waiting()
        except Exception:  # logging must never break training
            logger.exception("brakeline: run.log failed (metrics skipped)")

    def step_boundary(self, step: int | None = None) -> None:
        """Call once per step, after optimizer.step(): commands are applied here, and only here
        (or while a wrapped loader waits for its next batch)."""
        self._pace.step_ended()
        self.step = self.step + 1 if step is None else step
        self._progress += 1
        self._stepping = True
        if self._guard.tripped_step is not None:
            self._hold_for_decision(self._guard.take_trip())
        self._commands_at_boundary(self.step)
        self._pace.step_started()  # what the boundary did is not the next step's work

    def keepalive(self) -> None:
        """Count as progress during long phases without steps (evaluation, data warm-up)."""
        self._progress += 1

    def _before_fetch(self) -> None:
        self._commands_at_boundary(self.step, fetching=True)
        pause = self._pause
        held = self.finished or self.stopping or pause.state is not PauseState.RUNNING
        if pause.data_paused and not held:
            pause.hold(self.step)

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
        merged = {**self.handler_results.pop(str(command_id), {}), **dict(result or {})}
        apply_at = self._applied_at.pop(str(command_id), None)
        if apply_at is not None:
            merged.setdefault("apply_at_step", apply_at)
        if self._world_size or self.settings.rank:
            # Multi-rank: the console counts the ranks' acks (all at the same step, or split).
            merged.setdefault("rank", self.settings.rank)
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
