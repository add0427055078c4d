"""Fail-over mid-brake, CI-sized: Redis under Sentinel loses its master, PostgreSQL under
Patroni switches its primary, while a NaN is on its way to its brake (bench/ha_faults.py).

Each row fails if any count of the fault table is not zero (points lost or duplicated, NaNs not
braked or braked twice, the hung job missed, healthy jobs braked, pages missed or doubled), if
the console does not recover, or if the NaN was not logged while the part had no master (the
fault would then not have overlapped the brake it claims to test).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bench import ha_faults
from bench._hastack import HAStack, ha_missing
from bench.faults import run_fault, table
from tests.faults.criteria import failures
from tests.faults.stacks import started

JOBS = 3
RESULTS: list[tuple] = []


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[HAStack, dict, object]]:
    spill = tmp_path_factory.mktemp("spill")
    with started(HAStack(), ha_faults.FAULTS, JOBS, spill, ha_missing()) as running:
        yield running


@pytest.mark.parametrize("fault", ha_faults.FAULTS, ids=[f.key for f in ha_faults.FAULTS])
def test_a_fail_over_mid_brake_brakes_once_and_loses_nothing(stack, fault):
    running, created, spill = stack
    result = run_fault(running, fault, JOBS, spill, created)
    RESULTS.append((fault, result))
    report = f"{table([(fault, result)])}\n" + "\n".join(
        ha_faults.failover_lines([(fault, result)])
    )
    assert failures(result) == [], f"{report}\n{running.logs()}"
