"""What an out-of-band executor reports, and the one interface every executor has.

The lowest module of the executors: the control plane records outcomes on the timeline, and
every executor (local processes, Slurm) returns one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
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
