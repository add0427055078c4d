"""Proof that a process on this host is a job's, right before it is signalled.

An agent names its pid and host, and an agent can say anything: every local signal (the
whole-job stop, a replica's restart) is aimed only at a process these checks prove is the job's.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from core.processes import process_environment, process_group, process_start_time
from incidents.models import AgentToken, Job, hash_token


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


def wait_for_exit(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not process_is_running(pid):
            return True
        time.sleep(0.05)
    return not process_is_running(pid)


def is_the_consoles_own(pid: int) -> bool:
    """PID 1, this process, its parent, or any process of its group: never a job's."""
    return pid in {1, os.getpid(), os.getppid()} or process_group(pid) == os.getpgid(0)


def identity_refusal(job: Job, pid: int) -> str | None:
    """Why ``pid`` is not proven to be the job's process on this host, or None when it is.

    An agent's heartbeat says which pid it runs as, and an agent can say anything. So the pid is
    signalled only when, at this very moment:

    - the job's process reported this host as its own (``hostname`` = this machine's name);
    - it is not PID 1, the console's own process, its parent, or in its process group;
    - its start time (/proc/PID/stat field 22) is the one the console read when the pid was
      first registered from this host (``Job.agent_pid_start_time``): a pid reused by another
      process since then has another start time;
    - its environment as started (/proc/PID/environ) carries one of the job's agent tokens
      (``BRAKELINE_TOKEN``) or its marker (``BRAKELINE_JOB_MARKER``, the token's first 12
      characters, exported by the SDK to the processes it starts): a process of somebody else,
      which an agent merely named, has neither.
    """
    if job.agent_hostname != socket.gethostname():
        where = f"on {job.agent_hostname}" if job.agent_hostname else "without naming its host"
        return (
            f"the job reported process {pid} {where}, not on this worker's host "
            f"{socket.gethostname()}; a local signal cannot be aimed at it (use the scheduler's "
            "executor)"
        )
    if is_the_consoles_own(pid):
        return f"process {pid} is PID 1 or one of the console's own processes"
    if job.agent_pid_start_time is None:
        return (
            f"process {pid} was never registered from this host (no start time recorded when "
            "its heartbeat first reported it)"
        )
    started = process_start_time(pid)
    if started is None:
        return None  # gone: nothing to signal (the caller reports it gone)
    if started != job.agent_pid_start_time:
        return (
            f"process {pid} started at tick {started}, not at {job.agent_pid_start_time} as the "
            "job's process did: the pid now belongs to another process"
        )
    return environment_refusal(job, pid)


def environment_refusal(job: Job, pid: int) -> str | None:
    environment = process_environment(pid)
    if environment is None:
        return f"the environment of process {pid} cannot be read to check it is the job's"
    tokens = AgentToken.objects.filter(job_id=job.pk, revoked_at__isnull=True)
    hashes = set(tokens.values_list("token_hash", flat=True))
    prefixes = set(tokens.values_list("prefix", flat=True))
    token = environment.get("BRAKELINE_TOKEN", "")
    marker = environment.get(JOB_MARKER_VARIABLE, "")
    if (token and hash_token(token) in hashes) or (marker and marker in prefixes):
        return None
    return (
        f"process {pid} does not carry the job's token in its environment (BRAKELINE_TOKEN or "
        f"{JOB_MARKER_VARIABLE}): it is not proven to be the job's process"
    )


JOB_MARKER_VARIABLE = "BRAKELINE_JOB_MARKER"
