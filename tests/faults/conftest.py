"""Print the fault table at the end of the run, whatever the outcome."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter) -> None:
    from bench import faults as bench
    from tests.faults.test_faults import RESULTS

    if RESULTS:
        terminalreporter.write_sep("-", "fault table (tests/faults, CI-sized)")
        terminalreporter.write_line(bench.table(RESULTS))
