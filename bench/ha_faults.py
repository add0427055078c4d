"""Fail-over under load: Redis Sentinel and PostgreSQL Patroni mid-brake, figures printed.

    python bench/ha_faults.py                   # both faults, 4 jobs each
    python bench/ha_faults.py sentinel-failover

The console runs against Redis under Sentinel (a master, a replica, three sentinels) and
PostgreSQL under Patroni (two members, one etcd), as docs/deployment-ha.md describes
(bench/_hastack.py). In each fault the NaN is logged while the part has no master (the Redis
master killed, not yet replaced; the old PostgreSQL primary stepped down, the new one not yet
promoted), so its brake must cross the fail-over; the row fails when it did not. The table is
bench/faults.py's, with the fail-over's own duration printed below it.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "sdk")]

from bench._faultjobs import Fault, Scenario  # noqa: E402
from bench._faultstack import wait_until  # noqa: E402
from bench._hastack import HAStack  # noqa: E402
from bench.faults import report, run_chosen  # noqa: E402


def _nan_logged(scenario: Scenario) -> float:
    scenario.nan_now()
    wait_until(lambda: scenario.nan_during.nan_logged_at, "the NaN to be logged", 10, 0.005)
    return scenario.nan_during.nan_logged_at or 0.0


def sentinel_failover(stack: HAStack, scenario: Scenario) -> None:
    """SIGKILL the Redis master; the NaN goes out before the sentinels promote the replica."""
    scenario.mark_down()
    killed_at = time.monotonic()
    index = stack.kill_redis_master()
    nan_at = _nan_logged(scenario)
    old = stack.redis_ports[index]
    wait_until(lambda: stack.redis_master() not in (None, old), "a new Redis master", 60, 0.02)
    promoted_at = time.monotonic()
    scenario.evidence.update(window=(killed_at, promoted_at), nan_at=nan_at)
    stack.restart_redis_server(index)


def patroni_switchover(stack: HAStack, scenario: Scenario) -> None:
    """Patroni moves the primary; the NaN goes out while no member takes writes."""
    old = stack.leader()
    switching = threading.Thread(target=stack.switchover, daemon=True)
    scenario.mark_down()
    switching.start()
    wait_until(lambda: stack.leader() != old, "the old primary to step down", 60, 0.01)
    stepped_down_at = time.monotonic()
    nan_at = _nan_logged(scenario)
    wait_until(lambda: stack.leader() not in (None, old), "the new primary", 60, 0.02)
    promoted_at = time.monotonic()
    switching.join(120)
    scenario.evidence.update(window=(stepped_down_at, promoted_at), nan_at=nan_at)


def overlapped(stack: HAStack, scenario: Scenario) -> str:
    """The NaN was logged while there was no master, so its brake crossed the fail-over."""
    window, nan_at = scenario.evidence.get("window"), scenario.evidence.get("nan_at")
    if window is None or nan_at is None:
        return "the fail-over was not observed"
    began, ended = window
    if not began <= nan_at <= ended:
        return (
            f"the NaN was logged {nan_at - began:+.2f} s from the loss of the master, "
            f"outside the {ended - began:.2f} s without one"
        )
    return ""


def failover_lines(results: list[tuple[Fault, dict]]) -> list[str]:
    """How long each part had no master (the fail-over's own duration)."""
    lines = []
    for fault, result in results:
        window = result.get("evidence", {}).get("window")
        if window is not None:
            lines.append(f"{fault.title}: no master for {window[1] - window[0]:.2f} s")
    return lines


FAULTS = [
    Fault(
        "sentinel-failover",
        "Redis master SIGKILLed (Sentinel fails over)",
        sentinel_failover,
        overlapped=overlapped,
        red_required=False,
    ),  # type: ignore[arg-type]
    Fault(
        "patroni-switchover",
        "PostgreSQL switch-over (Patroni) mid-brake",
        patroni_switchover,
        overlapped=overlapped,
        red_required=False,
    ),  # type: ignore[arg-type]
]


def run(keys: list[str], jobs: int, stack: HAStack | None = None) -> list[tuple[Fault, dict]]:
    chosen = [fault for fault in FAULTS if not keys or fault.key in keys]
    return run_chosen(chosen, jobs, stack, HAStack)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("faults", nargs="*", help="fault keys (default: both)")
    parser.add_argument("--jobs", type=int, default=4, help="simulated jobs per fault (≥ 3)")
    options = parser.parse_args()
    results = run(options.faults, max(3, options.jobs))
    return report(results, *failover_lines(results))


if __name__ == "__main__":
    sys.exit(main())
