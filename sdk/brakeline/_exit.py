"""Leaving for good: the launcher a rank runs under, and the exit protocol of ``terminate``.

A launcher restarts ranks that fail: torchrun's elastic agent relaunches the whole worker group
when any worker exits non-zero (``--max-restarts``), so a terminated job would come back. Three
things keep a terminate a terminate (docs/sdk.md "Exit protocol"):

- Before a rank leaves on ``terminate`` it writes the *terminated marker*
  (``<checkpoint_dir>/.brakeline-terminated.json``: the command, the step and the launch's run
  id), fsynced and renamed into place, so every rank of the launch and every relaunch sees it.
- Under an elastic launcher (``TORCHELASTIC_RUN_ID`` set) the rank exits with
  :data:`EXIT_TERMINATED_UNDER_LAUNCHER` (0): torchrun has no "do not restart" code, and any
  other code is a failure it answers with a restart. Elsewhere the code is EXIT_TERMINATED (75).
- On terminate under torchrun the rank also SIGTERMs its elastic agent (:func:`leave_terminated`,
  still its parent with the same start time): the agent stops every worker and exits, and a
  signalled agent restarts nothing, even when a peer never received the terminate.
- :func:`exit_if_terminated` runs in ``brakeline.init``: a rank started by the same launch
  (same run id) after the marker was written exits at once with that code, before training
  (after a barrier with its peers when the process group is already formed).

The launcher's identity goes into every heartbeat (``launcher_pid``, ``launcher_pgid``,
``launcher_start_time``) so the console's executor stops the whole job through it, never one
rank's pid alone, and checks the start time right before it signals (pids wrap).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from brakeline._settings import EXIT_TERMINATED

logger = logging.getLogger("brakeline")

#: Exit code of a terminated rank under an elastic launcher (torchrun): success, so the agent
#: does not restart the worker group. The marker file says it was a terminate.
EXIT_TERMINATED_UNDER_LAUNCHER = 0
MARKER_NAME = ".brakeline-terminated.json"
# The variables that name one launch of the job, first found wins: torchrun's rendezvous run id
# (the same for every restart of one torchrun), else the scheduler's job id.
RUN_ID_VARIABLES = ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "BRAKELINE_RUN_ID")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = raw.rpartition(")")[2].split()
    return fields if len(fields) >= 20 else None


def launcher_fields(environ: Mapping[str, str]) -> dict[str, int]:
    """``launcher_pid``/``launcher_pgid``/``launcher_start_time`` (proc(5) fields 5 and 22 of
    the parent) when this rank runs under torchrun's elastic agent, else nothing."""
    if not environ.get("TORCHELASTIC_RUN_ID"):
        return {}
    parent = os.getppid()
    fields = _stat_fields(parent)
    if parent <= 1 or fields is None:
        return {}
    try:
        return {
            "launcher_pid": parent,
            "launcher_pgid": int(fields[5 - 3]),
            "launcher_start_time": int(fields[22 - 3]),
        }
    except ValueError:
        return {}


def run_id(environ: Mapping[str, str]) -> str:
    for name in RUN_ID_VARIABLES:
        if environ.get(name):
            return f"{name}={environ[name]}"
    return ""


def terminate_exit_code(environ: Mapping[str, str]) -> int:
    if environ.get("TORCHELASTIC_RUN_ID"):
        return EXIT_TERMINATED_UNDER_LAUNCHER
    return EXIT_TERMINATED


def marker_path(checkpoint_dir: str | Path) -> Path:
    return Path(checkpoint_dir) / MARKER_NAME


def write_marker(
    checkpoint_dir: str | Path, environ: Mapping[str, str], command_id: Any, step: int, rank: int
) -> Path | None:
    """Record the terminate where every rank and relaunch looks (atomic, fsynced); None when
    the folder is not writable (the terminate still happens, only a relaunch is not stopped)."""
    path = marker_path(checkpoint_dir)
    body = {
        "run_id": run_id(environ),
        "command_id": command_id,
        "step": step,
        "rank": rank,
        "time": time.time(),
    }
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "w") as handle:
            json.dump(body, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        descriptor = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as error:
        logger.warning("brakeline: terminated marker not written at %s: %s", path, error)
        temporary.unlink(missing_ok=True)
        return None
    return path


def read_marker(checkpoint_dir: str | Path) -> dict[str, Any] | None:
    try:
        body = json.loads(marker_path(checkpoint_dir).read_text())
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def terminated_launch(checkpoint_dir: str | Path, environ: Mapping[str, str]) -> dict | None:
    """The marker, when it was written by this very launch (same run id); None otherwise: a
    new launch of the job (another torchrun, another Slurm job) starts normally, and a process
    without a launcher's run id has no relaunch to stop."""
    current = run_id(environ)
    marker = read_marker(checkpoint_dir) if current else None
    return marker if marker is not None and marker.get("run_id") == current else None


def exit_if_terminated(
    checkpoint_dir: str | Path,
    environ: Mapping[str, str],
    exit_function: Callable[[int], Any],
) -> None:
    """At init: a rank relaunched after its launch was terminated leaves at once."""
    marker = terminated_launch(checkpoint_dir, environ)
    if marker is None:
        return
    code = terminate_exit_code(environ)
    logger.warning(
        "brakeline: this launch (%s) was terminated by command %s at step %s; exiting with %d "
        "without training (remove %s to start it again)",
        marker.get("run_id"),
        marker.get("command_id"),
        marker.get("step"),
        code,
        marker_path(checkpoint_dir),
    )
    _leave_together()
    exit_function(code)


def leave_terminated(
    launcher: Mapping[str, int], environ: Mapping[str, str], exit_function: Callable[[int], Any]
) -> None:
    """Leave on terminate. Under torchrun, first SIGTERM the elastic agent this rank was
    started by (still our parent, with the start time it had at init: pids wrap): the agent
    then stops every worker — peers blocked in a collective included — and exits without a
    restart. Without that, a peer that never got the terminate fails in its next collective
    and the agent restarts the group. We wait (bounded) for the agent's own SIGTERM."""
    code = terminate_exit_code(environ)
    if launcher and _still_our_launcher(launcher):
        try:
            os.kill(launcher["launcher_pid"], signal.SIGTERM)
        except OSError as error:
            logger.warning("brakeline: could not stop the launcher: %s", error)
        else:
            deadline = time.monotonic() + LAUNCHER_STOP_WAIT_SECONDS
            while time.monotonic() < deadline and os.getppid() == launcher["launcher_pid"]:
                time.sleep(0.05)  # the agent's SIGTERM ends this process meanwhile
    exit_function(code)


LAUNCHER_STOP_WAIT_SECONDS = 10.0


def _still_our_launcher(launcher: Mapping[str, int]) -> bool:
    pid = launcher.get("launcher_pid")
    fields = _stat_fields(pid) if pid and os.getppid() == pid else None
    return fields is not None and fields[22 - 3] == str(launcher.get("launcher_start_time"))


def _leave_together() -> None:
    """In a process group already formed, leave after a barrier: a rank that exits while a
    peer still connects its mesh makes that peer fail (exit 1), which torchrun answers with
    another restart. Every rank of the relaunch finds the marker, so every rank reaches it."""
    import sys

    distributed = sys.modules.get("torch.distributed")  # never imports torch by itself
    try:
        if distributed is not None and distributed.is_initialized():
            distributed.barrier()
    except Exception as error:  # leaving matters more than leaving together
        logger.warning("brakeline: barrier before leaving failed: %s", error)
