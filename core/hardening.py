"""The console's processes are not dumpable: another process of the same user cannot read
their environment (/proc/PID/environ: the secret key, the database URL) or their memory.

Linux lets a process of the same uid read another's /proc/PID/environ unless the target is
not dumpable; then only a process with ``CAP_SYS_PTRACE`` may. A drill's sandbox runs without
any capability (``breakers.drills.sandbox_exec``), so it reads nothing of the console even when
it runs as the console's user. The flag is inherited by forks (Celery's pool) and reset by
``exec`` (a job's process started by the console is dumpable again, as it should be).
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


def refuse_inspection() -> None:
    """Make this process not dumpable (Linux; elsewhere nothing to do)."""
    if sys.platform != "linux":
        return
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def dumpable() -> bool:
    if sys.platform != "linux":
        return True
    return bool(ctypes.CDLL(None, use_errno=True).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
