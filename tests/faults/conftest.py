"""Print the fault table at the end of the run, whatever the outcome."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter) -> None:
    from bench import faults as bench
    from bench.ha_faults import failover_lines
    from tests.faults.test_faults import RESULTS
    from tests.faults.test_ha_faults import RESULTS as HA_RESULTS

    if RESULTS:
        terminalreporter.write_sep("-", "fault table (tests/faults, CI-sized)")
        terminalreporter.write_line(bench.table(RESULTS))
    if HA_RESULTS:
        terminalreporter.write_sep("-", "fail-over table (Sentinel, Patroni; CI-sized)")
        terminalreporter.write_line(bench.table(HA_RESULTS))
        terminalreporter.write_line("\n".join(failover_lines(HA_RESULTS)))
