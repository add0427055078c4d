"""A fault stack started for a module of the fault suite, with the jobs of its faults."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench._faultjobs import Fault
from bench._faultstack import Stack
from bench.faults import all_timeouts, create_jobs


@contextmanager
def started(
    stack: Stack, faults: list[Fault], jobs: int, spill: Path, missing: str | None
) -> Iterator[tuple[Stack, dict, Path]]:
    """``stack`` running with every fault's jobs created; a failure (never a skip) when this
    machine lacks a server it needs: a real-component suite that skips is silently green."""
    if missing:
        pytest.fail(f"the fault suite cannot start its stack: {missing}")
    try:
        stack.start()
        yield stack, create_jobs(stack, all_timeouts(faults, jobs)), spill
    finally:
        stack.close()
