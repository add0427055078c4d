"""Out-of-band executors: stopping a job without its cooperation, when it is hung.

The control plane asks the job first (a command it acknowledges). When the acknowledgement
does not come in time the job is presumed hung, and an executor stops it from the outside.
Executors sit behind one small interface so the scheduler-specific ones (Slurm, Kubernetes)
plug in next to the local-process default.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

from incidents.models import Job


@dataclass(frozen=True)
class ExecutorOutcome:
    executor: str
    stopped: bool
    steps: list[str] = field(default_factory=list)  # what was done, in order, for the timeline
    detail: str = ""
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class Executor(Protocol):
    name: str

    def stop(self, job: Job, *, grace_seconds: float) -> ExecutorOutcome: ...


def process_is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an exited child nobody reaped yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in {"Z", "X"}


def _wait_for_exit(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not process_is_running(pid):
            return True
        time.sleep(0.05)
    return not process_is_running(pid)


class LocalProcessExecutor:
    """Signals the training process the SDK registered (its PID): SIGTERM, then SIGKILL."""

    name = "local"

    def stop(self, job: Job, *, grace_seconds: float) -> ExecutorOutcome:
        started = time.monotonic()
        pid = job.agent_pid
        if not pid:
            return ExecutorOutcome(self.name, False, detail="The job never reported a process id.")
        if job.agent_hostname and job.agent_hostname != socket.gethostname():
            return ExecutorOutcome(
                self.name,
                False,
                detail=f"The job runs on {job.agent_hostname}, not on this worker's host; "
                "a local signal cannot reach it (use the scheduler's executor).",
            )
        if not process_is_running(pid):
            return ExecutorOutcome(self.name, True, [f"process {pid} was already gone"])
        steps = [f"SIGTERM to process {pid}"]
        os.kill(pid, signal.SIGTERM)
        if not _wait_for_exit(pid, grace_seconds):
            steps.append(f"still running after {grace_seconds:g} s grace: SIGKILL to {pid}")
            os.kill(pid, signal.SIGKILL)
            _wait_for_exit(pid, 5.0)
        stopped = not process_is_running(pid)
        steps.append("process exited" if stopped else "process did not exit")
        return ExecutorOutcome(self.name, stopped, steps, seconds=time.monotonic() - started)


EXECUTORS: dict[str, Executor] = {"local": LocalProcessExecutor()}


def executor_for(job: Job) -> Executor:
    """The executor the job's scheduler binding names (breakers.executors.scheduler); local by
    default."""
    # Imported here: the Slurm executor's module builds on this one (and registers itself).
    from breakers.executors.scheduler import executor_name
    from breakers.executors.slurm import executor as slurm  # noqa: F401

    return EXECUTORS.get(executor_name(job.pk), EXECUTORS["local"])
