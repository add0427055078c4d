"""Where a run is, and what its heartbeats say about it.

:class:`RunState` is the one piece of state every part of a run reads: the step, the status the
heartbeats carry, whether the run finished or is stopping, and the progress counter that tells a
hung loop from a slow one. The training thread writes it; the control thread reads it to build
heartbeats. Every attribute is a single assignment of an immutable value, atomic under the GIL,
so the training thread never takes a lock on its fast path.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from brakeline._exit import launcher_fields
from brakeline._pace import StepPace
from brakeline._settings import Settings
from brakeline.snapshot import heartbeat_scheduler_fields

STATUSES = ("running", "paused", "checkpointing", "finished", "holding")


class RunState:
    """The run's step, status and progress (see the module doc)."""

    def __init__(self) -> None:
        self.step = 0
        self.status = "running"
        self.finished = False
        # Set by terminate: a framework is stopping gracefully; no more pausing or holding.
        self.stopping = False
        # Bumped by every step boundary and keepalive: heartbeats need it to move.
        self.progress = 0
        # The loop has reached its first step boundary: from then on, no progress is a hang.
        self.stepping = False

    def next_step(self) -> int:
        """The step being computed: the last boundary's + 1."""
        return self.step + 1

    def keepalive(self) -> None:
        """Count as progress (a long phase without steps, or a hold on purpose)."""
        self.progress += 1


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


class HeartbeatBody:
    """Builds each heartbeat (in the control thread) from the run's state, its step pace and
    what the process's environment says about it (read once: the scheduler context, the
    launcher and the world size of a process do not change while it runs)."""

    def __init__(
        self,
        settings: Settings,
        state: RunState,
        pace: StepPace,
        environ: Mapping[str, str],
    ) -> None:
        self._settings = settings
        self._state = state
        self._pace = pace
        self.hostname = socket.gethostname()
        self.scheduler_fields = heartbeat_scheduler_fields(environ)
        self.world_size = world_size_field(environ, settings.rank)
        self.launcher = launcher_fields(environ)  # whom the executor stops (brakeline._exit)
        self._progress_at_heartbeat: tuple[int, int] = (-1, -1)

    @property
    def multi_rank(self) -> bool:
        """This process is one rank of several (its acknowledgements must name the rank)."""
        return bool(self.world_size or self._settings.rank)

    def __call__(self) -> dict[str, Any] | None:
        # After the first step a "running" heartbeat needs training progress since the
        # previous one, so a hung loop turns into a heartbeat timeout. Entering a gradient sync
        # is news too: a rank blocked in one says so, once, before it falls silent, so the
        # console can tell it from the rank it waits for.
        state = self._state
        progress = (state.progress, self._pace.entered)
        if (
            self._settings.heartbeat_requires_progress
            and state.stepping
            and state.status == "running"
            and progress == self._progress_at_heartbeat
        ):
            return None
        self._progress_at_heartbeat = progress
        return {
            "step": state.step,
            "status": state.status,
            "pid": os.getpid(),
            "hostname": self.hostname,
            "rank": self._settings.rank,
            **self.world_size,
            **self._pace.heartbeat_fields(),
            **self.launcher,
            **self.scheduler_fields,
        }
