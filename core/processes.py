"""What Linux's /proc says about a local process: its start time, process group and environment.

Used to tell whether a process id an agent reported really is the job's process before anything
signals it (``breakers.executors.identity``), and to record the process's identity when the pid is
first registered (``incidents.heartbeats.record_heartbeat``). Every reader returns None when the
process does not exist or cannot be read; nothing here raises for a missing process.
"""

from __future__ import annotations

import socket
from pathlib import Path


def this_host() -> str:
    """The name of the machine this console process runs on (what the SDK reports as
    ``hostname``: ``socket.gethostname()``)."""
    return socket.gethostname()


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses): the
    fields from the third on, so field N of proc(5) is ``fields[N - 3]``."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    _, _, rest = raw.rpartition(")")
    fields = rest.split()
    return fields if len(fields) >= 20 else None


def process_start_time(pid: int) -> int | None:
    """When the process started, in clock ticks after boot (proc(5) field 22, ``starttime``):
    a reused pid has another start time, so (pid, start time) names one process."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[22 - 3])
    except ValueError:
        return None


def process_group(pid: int) -> int | None:
    """The process group id (proc(5) field 5, ``pgrp``)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[5 - 3])
    except ValueError:
        return None


def process_parent(pid: int) -> int | None:
    """The parent's pid (proc(5) field 4, ``ppid``)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[4 - 3])
    except ValueError:
        return None


def process_environment(pid: int) -> dict[str, str] | None:
    """The environment the process was started with (/proc/PID/environ): what it had at
    ``exec``, not later changes of its own ``os.environ``. None when it cannot be read (the
    process is gone, or belongs to another user and this one is not privileged)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    environment = {}
    for entry in raw.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if equals:
            environment[name.decode(errors="replace")] = value.decode(errors="replace")
    return environment
