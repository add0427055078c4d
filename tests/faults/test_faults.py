"""The fault suite, CI-sized: each fault once, three SDK-driven jobs, shorter outages.

bench/faults.py is the full run (more jobs, beat down 20 s, the console down 30 s); this is the
same code on a stack of its own (its own PostgreSQL cluster and Redis on free ports: the
machine's shared services are never touched). For each fault the test fails if any count of
the table is not zero: points lost or duplicated, NaNs not braked or braked twice, the hung
job missed, pages missed or doubled, alerts or commands doubled, a healthy job braked, the
health endpoint green while the part was down (reported only for the PostgreSQL restart:
its probes wait for the database instead of answering) or not green after, or the fault not
shown to have struck what it tests (tests/faults/criteria.py). The table is printed in
the terminal summary (tests/faults/conftest.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import faults as bench
from bench._faultstack import Stack, pg_bin
from tests.faults.criteria import failures
from tests.faults.stacks import started

JOBS = 3
BEAT_DOWN = 8.0
CONSOLE_DOWN = 10.0
FAULTS = bench.faults(BEAT_DOWN, CONSOLE_DOWN)
RESULTS: list[tuple[bench.Fault, dict]] = []


def _missing() -> str | None:
    try:
        pg_bin()
    except RuntimeError as error:
        return str(error)
    return None if shutil.which("redis-server") else "redis-server is not installed"


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[Stack, dict, Path]]:
    with started(Stack(), FAULTS, JOBS, tmp_path_factory.mktemp("spill"), _missing()) as running:
        yield running


@pytest.mark.parametrize("fault", FAULTS, ids=[fault.key for fault in FAULTS])
def test_the_fault_loses_nothing_doubles_nothing_and_misses_no_brake(stack, fault):
    running, created, spill = stack
    result = bench.run_fault(running, fault, JOBS, spill, created)
    RESULTS.append((fault, result))
    if failures(result):
        running.dump_stacks()  # what each worker is doing now, into its log
    assert failures(result) == [], f"{bench.table([(fault, result)])}\n{running.logs()}"
