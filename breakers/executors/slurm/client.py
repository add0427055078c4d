"""Slurm's command-line clients, run as subprocesses: one call, its exit status and output.

Nothing here writes anywhere: the executor (``breakers.executors.slurm.executor``) puts each
call on the incident's timeline, and the target checks (``breakers.executors.targets``) read a
job's node list through it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

OUTPUT_LIMIT = 4000  # characters of stdout/stderr kept on the timeline


def slurm_bin_dir() -> str:
    return getattr(settings, "SLURM_BIN_DIR", "") or os.environ.get("BRAKELINE_SLURM_BIN_DIR", "")


def slurm_conf() -> str | None:
    return getattr(settings, "SLURM_CONF", None) or os.environ.get("SLURM_CONF") or None


@dataclass(frozen=True)
class SlurmCall:
    argv: tuple[str, ...]
    returncode: int | None  # None: it could not run, or timed out
    stdout: str
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    @property
    def output(self) -> str:
        return "\n".join(part for part in (self.stdout.strip(), self.stderr.strip()) if part)

    def as_data(self) -> dict[str, Any]:
        return {
            "command_line": self.command_line,
            "argv": list(self.argv),
            "exit_status": self.returncode,
            "stdout": self.stdout[:OUTPUT_LIMIT],
            "stderr": self.stderr[:OUTPUT_LIMIT],
            "seconds": round(self.seconds, 3),
        }


def run_slurm(arguments: list[str]) -> SlurmCall:
    """Run one Slurm client command; never raises (a failure is a SlurmCall that is not ok)."""
    tool, *rest = arguments
    argv = (os.path.join(slurm_bin_dir(), tool) if slurm_bin_dir() else tool, *rest)
    env = dict(os.environ)
    conf = slurm_conf()
    if conf:
        env["SLURM_CONF"] = conf
    started = time.monotonic()
    try:
        completed = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            timeout=float(settings.SLURM_COMMAND_TIMEOUT_SECONDS),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return SlurmCall(argv, None, "", f"{type(error).__name__}: {error}", seconds_since(started))
    return SlurmCall(
        argv, completed.returncode, completed.stdout, completed.stderr, seconds_since(started)
    )


def seconds_since(started: float) -> float:
    return time.monotonic() - started


def job_nodes(nodelist: str) -> tuple[list[str] | None, SlurmCall | None]:
    """The node names of a host list (``scontrol show hostnames``); None if Slurm refused."""
    if not nodelist:
        return [], None
    call = run_slurm(["scontrol", "show", "hostnames", nodelist])
    return (call.stdout.split() if call.ok else None), call
