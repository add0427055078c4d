"""Restarting a replica's process on this host: stop it, start the same command again.

The inference L3 response restarts a replica from outside, so a wedged replica (one that
answers NaN, or nothing) restarts without its cooperation. The process is the one its
heartbeats reported, proven to be the job's exactly as the local executor proves it before a
stop (``breakers.executors.identity.identity_refusal``: this host, the start time recorded when
the pid was registered, the job's token in its environment).

What is started again is what was running: the command line, working directory and
environment read from /proc/PID before the stop, its standard output and error appended to the
same files when they were files — and as who was running it: the replaced process's uid, gid
and groups (``breakers.executors.targets.restart_identity``). A worker that cannot take that
identity refuses the restart, so a restart never runs with more privilege than the process it
replaces. The new process gets a session of its own, so it outlives the worker that started it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from breakers.executors.identity import process_is_running as running
from breakers.executors.identity import wait_for_exit
from breakers.executors.outcome import ExecutorOutcome
from breakers.executors.targets import ProcessIdentity, local_process, register, restart_identity
from breakers.models import InferenceReplica
from core.processes import process_environment
from incidents.models import Job

NAME = "local-restart"
# Started processes, polled so the ones that exit are reaped (no zombies in a long worker).
_started: list[subprocess.Popen] = []


@dataclass(frozen=True)
class _Identity:
    """The replica's process as identity_refusal reads a job's: pk, host, start time."""

    pk: int
    agent_hostname: str
    agent_pid_start_time: int | None


@dataclass(frozen=True)
class Relaunch:
    command: list[str]
    cwd: str
    environment: dict[str, str]
    stdout: str | None
    stderr: str | None
    identity: ProcessIdentity


def _output_file(pid: int, fd: int) -> str | None:
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None
    return target if target.startswith("/") and Path(target).is_file() else None


def read_relaunch(pid: int, identity: ProcessIdentity) -> Relaunch | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    command = [part.decode(errors="surrogateescape") for part in raw.split(b"\0") if part]
    environment = process_environment(pid)
    if not command or environment is None:
        return None
    stdout, stderr = _output_file(pid, 1), _output_file(pid, 2)
    return Relaunch(command, cwd, environment, stdout, stderr, identity)


def _open(path: str | None) -> IO[bytes] | int:
    return open(path, "ab") if path else subprocess.DEVNULL  # noqa: SIM115 (handed to Popen)


def _start(relaunch: Relaunch) -> int:
    for process in list(_started):
        if process.poll() is not None:
            _started.remove(process)
    stdout, stderr = _open(relaunch.stdout), _open(relaunch.stderr)
    who = relaunch.identity
    # As root, the child drops to the replaced process's identity before exec; otherwise the
    # seam has checked that identity is this worker's own.
    drop = (
        {"user": who.uid, "group": who.gid, "extra_groups": list(who.groups)}
        if os.geteuid() == 0
        else {}
    )
    try:
        process = subprocess.Popen(  # type: ignore[call-overload]
            relaunch.command,
            cwd=relaunch.cwd,
            env=relaunch.environment,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            **drop,
        )
    finally:
        for handle in (stdout, stderr):
            if not isinstance(handle, int):
                handle.close()
    _started.append(process)
    return process.pid


def restart_replica(replica: InferenceReplica, *, grace_seconds: float) -> ExecutorOutcome:
    """SIGTERM (SIGKILL after the grace) the replica's proven process, then start it again."""
    started = time.monotonic()
    pid = replica.pid
    if not pid:
        return ExecutorOutcome(NAME, False, detail="refused: the replica never reported a pid")
    job = Job.objects.get(pk=replica.job_id)
    identity = _Identity(job.pk, replica.hostname, replica.pid_start_time)
    why = local_process(cast(Job, identity), pid)
    who = restart_identity(pid) if why is None else None
    if isinstance(who, str):
        why = f"the restart would not run as the process it replaces: {who}"
    relaunch = read_relaunch(pid, who) if isinstance(who, ProcessIdentity) else None
    if why is None and relaunch is None:
        why = f"the command line of process {pid} cannot be read to start it again"
    if why is not None:
        return ExecutorOutcome(NAME, False, detail=f"refused: {why}")
    assert relaunch is not None
    steps = [
        f"SIGTERM to replica process {pid} (checked: this host, start time, job token; "
        f"restarted as uid {relaunch.identity.uid} gid {relaunch.identity.gid})"
    ]
    os.kill(pid, signal.SIGTERM)
    if not wait_for_exit(pid, grace_seconds):
        steps.append(f"still running after {grace_seconds:g} s: SIGKILL to {pid}")
        os.kill(pid, signal.SIGKILL)
        wait_for_exit(pid, 5.0)
    if running(pid):
        steps.append("the process did not exit: not started again")
        return ExecutorOutcome(NAME, False, steps, seconds=time.monotonic() - started)
    new_pid = _start(relaunch)
    steps.append(f"started again as process {new_pid}: {' '.join(relaunch.command)[:200]}")
    return ExecutorOutcome(
        NAME, True, steps, detail=str(new_pid), seconds=time.monotonic() - started
    )


register(
    NAME,
    __name__,
    acts_on="the replica's process proven the job's, restarted as its own uid/gid",
    check="restart_identity",
)
