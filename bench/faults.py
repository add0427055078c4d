"""Faults survived, figures printed: the real services die under real load.

    python bench/faults.py                 # the full run: 8 jobs, beat down 20 s, console 30 s
    python bench/faults.py --jobs 4 --beat-down 10 --console-down 15 redis-ingest console-down

Simulated jobs stream through the real ``brakeline`` SDK at a steady rate to a whole console of
this script's own (bench/_faultstack.py: its own PostgreSQL cluster, Redis, Daphne, two Celery
workers, beat, and a fake provider). In each fault two jobs go NaN at a known step (one while
the part is down, one after; the second is a real tiny PyTorch training whose loss turns NaN),
one stops heartbeating a second before the part goes down; the others stay healthy.
After each fault the table says, per fault: brake latency (NaN logged → command in the SDK)
for the NaN that fell inside the fault and the one after it, time until the console was healthy
again, and the counts that must be zero: points lost and duplicated (per job, against the steps
the clients logged), NaNs not braked or braked twice, hung jobs missed, pages not delivered or
doubled, alerts and commands doubled, and whether /api/v1/health went red and came back green.
Each fault also proves that it overlapped what it claims to test (the overlap column; by
default the NaN's brake came only after the part went down). tests/faults/ runs it CI-sized
and holds the pass and fail criteria (tests/faults/criteria.py).
The simulated jobs and scenarios are in bench/_faultjobs.py, the counts and the table in
bench/_faulttable.py; this module holds the faults and runs them.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "sdk")]

from bench._faultjobs import (  # noqa: E402
    Fault,
    Scenario,
    create_jobs,
    job_names,
    job_timeouts,
    make_jobs,
)
from bench._faultstack import Stack, wait_until  # noqa: E402
from bench._faulttable import (  # noqa: E402
    hung_alerts,
    hung_deadline,
    measure,
    pending_pages,
    table,
)

__all__ = [
    "Fault",
    "all_timeouts",
    "create_jobs",
    "faults",
    "job_names",
    "report",
    "run_chosen",
    "run_fault",
    "table",
]

# Killed workers stay away this long: longer than the health endpoint's 5 s worker cache, so
# the endpoint can see that nobody answers.
WORKERS_DOWN = 6.0
PG_DOWN = 1.0  # seconds PostgreSQL stays stopped in its restart
PG_AWAY = 12.0  # seconds PostgreSQL stays stopped when it is away for long
# The longest /api/v1/health may take to answer while PostgreSQL is away: the pool's timeout
# (3 s by default) once, then at once while the outage is fresh, with room for a loaded machine.
PG_AWAY_HEALTH_WAIT = 5.0
HANG_LEAD = 1.0  # seconds between the hung job's last step and the fault (two heartbeats)
# The healthy jobs' heartbeat timeout while the web tier is down for longer than it.
WEB_DOWN_HEALTHY_TIMEOUT = 5.0
# A silent job is caught at most this long after its deadline while the leading beat is dead.
BEAT_TAKEOVER_SECONDS = 2.0


# --- One fault, run and measured -----------------------------------------------------------


def _poll_health(scenario: Scenario, stopping: threading.Event) -> None:
    while not stopping.is_set():
        asked = time.monotonic()
        status = scenario.stack.health()[0]
        scenario.health.append((asked, status))
        scenario.health_waits.append((asked, time.monotonic() - asked))
        stopping.wait(0.2)


def run_fault(
    stack: Stack, fault: Fault, jobs: int, spill: Path, created: dict[str, list] | None = None
) -> dict:
    scenario = make_jobs(stack, fault, jobs, spill, created)
    stopping = threading.Event()
    poller = threading.Thread(target=_poll_health, args=(scenario, stopping), daemon=True)
    poller.start()
    try:
        wait_until(lambda: all(len(j.logged) > 20 for j in scenario.jobs), "jobs to stream", 60)
        # The hung job stops a little before the fault, so its last heartbeat has landed: one
        # still in flight when the part dies would arrive after the deadline, resolve the
        # alert (it does report progress) and the job would be alerted a second time.
        scenario.hung.hang.set()  # type: ignore[union-attr]
        time.sleep(HANG_LEAD)
        fault.inject(stack, scenario)
        scenario.mark_up()
        # After the fault: the second NaN, then everything the console owes.
        scenario.nan_after.nan_at = scenario.nan_after.step
        recovered = _recover(stack, scenario)
    finally:
        stopping.set()
        poller.join(5)
        # All at once: each flushes what it still holds, then ends its threads.
        finishing = [threading.Thread(target=job.finish) for job in scenario.jobs]
        for thread in finishing:
            thread.start()
        for thread in finishing:
            thread.join(180)
    result = measure(stack, scenario, recovered)
    result["overlap"] = fault.overlapped(stack, scenario)
    result["hung_within"] = fault.hung_within
    result["evidence"] = dict(scenario.evidence)
    result["health_wait"] = _slowest_health_answer(scenario)
    result["health_wait_within"] = fault.health_wait_within
    return {**result, "red_required": fault.red_required}


def _slowest_health_answer(scenario: Scenario) -> float | None:
    """The longest /api/v1/health took to answer while the part was down."""
    began, ended = scenario.fault_started or 0.0, scenario.fault_ended or 0.0
    waits = [wait for at, wait in scenario.health_waits if began <= at <= ended]
    return max(waits) if waits else None


def all_timeouts(chosen: list[Fault], jobs: int) -> dict[str, float]:
    return {name: t for fault in chosen for name, t in job_timeouts(fault, jobs).items()}


def _recover(stack: Stack, scenario: Scenario) -> float | None:
    """Seconds from the part's return to a healthy console that has done all it owes."""
    owed: dict[str, object] = {}

    def done() -> bool:
        owed["braked"] = scenario.nan_during.braked and scenario.nan_after.braked
        owed["hung"] = hung_alerts(stack, scenario)
        owed["health"] = stack.health()
        owed["pending_pages"] = pending_pages(stack, scenario)
        return bool(
            owed["braked"]
            and owed["hung"]
            and owed["health"][0] == 200  # type: ignore[index]
            and not owed["pending_pages"]
        )

    try:
        wait_until(done, "the console to catch up", timeout=120, interval=0.25)
    except TimeoutError:
        print(f"{scenario.jobs[0].name}: not caught up: {owed}", file=sys.stderr)
        return None
    return time.monotonic() - (scenario.fault_ended or time.monotonic())


# --- The faults -----------------------------------------------------------------------------


def _nan_stored(stack: Stack, scenario: Scenario) -> None:
    """The NaN goes out and is waited for until its batch is stored: its evaluation is owed."""
    scenario.nan_now()
    wait_until(
        lambda: stack.sql(
            "SELECT 1 FROM brakeline_points_after(%s, 0, 9223372036854775807) "
            "WHERE value = 'NaN' LIMIT 1",
            (scenario.nan_during.job_id,),
        ),
        "the NaN batch to be stored",
        20,
        0.005,
    )


def redis_mid_ingest(stack: Stack, scenario: Scenario) -> None:
    scenario.mark_down()
    stack.shutdown_redis()
    scenario.nan_now()  # the NaN is logged while Redis is away
    time.sleep(3)
    stack.start_redis()


def redis_mid_brake(stack: Stack, scenario: Scenario) -> None:
    """The NaN stored, its evaluation queued in Redis (the workers held still so that none
    takes it first), then Redis goes away with everything in it: the periodic tick must find
    the job's unevaluated points again."""
    stack.hold(stack.worker_names)
    try:
        _nan_stored(stack, scenario)
        scenario.mark_down()
        stack.shutdown_redis()
    finally:
        stack.hold(stack.worker_names, signal.SIGCONT)
    time.sleep(3)
    stack.start_redis()


def postgres_mid_ingest(stack: Stack, scenario: Scenario) -> None:
    # A fast stop, a second away, a start: long enough for the agents to meet the outage (503,
    # buffered, replayed). The NaN is logged while it is away. Its "red" column is reported
    # only (Fault.red_required).
    stack.stop_postgres()
    scenario.mark_down()
    scenario.nan_now()
    time.sleep(PG_DOWN)
    stack.start_postgres()


def postgres_away(seconds: float) -> Callable[[Stack, Scenario], None]:
    """PostgreSQL stopped for longer than the connection pool's timeout."""

    def inject(stack: Stack, scenario: Scenario) -> None:
        stack.stop_postgres()
        scenario.mark_down()
        scenario.nan_now()
        time.sleep(seconds)
        stack.start_postgres()

    return inject


def failing_brake(stack: Stack, scenario: Scenario) -> None:
    """Nothing of the console fails: the NaN job's own checkpoint does (its answer is
    "checkpoint failed"); the failed brake must page someone (Fault.brake_checkpoint_fails)."""
    scenario.mark_down()
    scenario.nan_now()
    wait_until(lambda: scenario.nan_during.braked, "the brake to reach the job", 60, 0.05)


def worker_mid_evaluation(stack: Stack, scenario: Scenario) -> None:
    """Every worker SIGKILLed while the NaN's evaluation is owed: held still (SIGSTOP) before
    the NaN, so that none can have judged it before the kill."""
    stack.hold(stack.worker_names)
    _nan_stored(stack, scenario)
    scenario.mark_down()
    for name in stack.worker_names:
        stack.kill(name)  # SIGKILL ends a stopped process too
    time.sleep(WORKERS_DOWN)
    for name in stack.worker_names:
        stack.start_worker(name)


def worker_mid_delivery(stack: Stack, scenario: Scenario) -> None:
    provider = stack.provider
    provider.arrived.clear()
    provider.hold = threading.Event()
    scenario.nan_now()
    wait_until(provider.arrived.is_set, "a page to be under way", 60, 0.01)
    scenario.mark_down()
    scenario.evidence["page_held"] = True
    for name in stack.worker_names:  # whichever holds the send
        stack.kill(name)
    provider.hold.set()
    provider.hold = None
    time.sleep(WORKERS_DOWN)
    for name in stack.worker_names:
        stack.start_worker(name)


def beat_down(seconds: float) -> Callable[[Stack, Scenario], None]:
    """The beat holding the lease is SIGKILLed: the other one must take the watchdog over."""

    def inject(stack: Stack, scenario: Scenario) -> None:
        leader = wait_until(stack.leading_beat, "a beat to hold the lease", 30, 0.1)
        scenario.evidence["killed_beat"] = leader
        scenario.mark_down()
        stack.kill(leader)
        scenario.evidence["down_at"] = time.time()
        scenario.nan_now()
        time.sleep(seconds)
        scenario.evidence["up_at"] = time.time()
        stack.start_beat(leader)

    return inject


def beat_overlap(stack: Stack, scenario: Scenario) -> str:
    """The hung job's deadline ran out while the leading beat was dead."""
    deadline = hung_deadline(stack, scenario)
    down, up = scenario.evidence.get("down_at"), scenario.evidence.get("up_at")
    if deadline is None or down is None or up is None:
        return "the hung job was never alerted, or the beat never killed"
    if not down <= deadline <= up:
        return f"the hung job's deadline fell {deadline - down:+.1f} s from the kill, outside it"
    return ""


def page_held(stack: Stack, scenario: Scenario) -> str:
    """A page was under way in the provider, held there, when the workers were killed."""
    return "" if scenario.evidence.get("page_held") else "no page was under way at the kill"


def web_down(seconds: float) -> Callable[[Stack, Scenario], None]:
    """Daphne alone is stopped, the workers and beats (the watchdog) keep running."""

    def inject(stack: Stack, scenario: Scenario) -> None:
        scenario.mark_down()
        stack.kill("daphne")
        scenario.evidence["down_at"] = time.time()
        scenario.nan_now()
        time.sleep(seconds)
        scenario.evidence["watchdog_at"] = stack.watchdog_last_run()
        stack.start_daphne()

    return inject


def web_overlap(stack: Stack, scenario: Scenario) -> str:
    """The watchdog ran while the healthy jobs' deadlines were past, the web tier still away."""
    down, ran = scenario.evidence.get("down_at"), scenario.evidence.get("watchdog_at")
    if down is None or ran is None:
        return "the watchdog's last run is unknown"
    if ran - down <= WEB_DOWN_HEALTHY_TIMEOUT:
        return f"the watchdog last ran {ran - down:.1f} s into the outage, before any deadline"
    return ""


def daphne_killed(stack: Stack, scenario: Scenario) -> None:
    scenario.mark_down()
    stack.kill("daphne", signal.SIGKILL)
    scenario.nan_now()
    time.sleep(1)
    stack.start_daphne()


def console_down(seconds: float) -> Callable[[Stack, Scenario], None]:
    def inject(stack: Stack, scenario: Scenario) -> None:
        scenario.mark_down()
        stack.kill_console()
        scenario.nan_now()
        time.sleep(seconds)
        stack.start_console()

    return inject


def faults(beat_seconds: float = 20.0, console_seconds: float = 30.0) -> list[Fault]:
    web_seconds = max(console_seconds, 2.5 * WEB_DOWN_HEALTHY_TIMEOUT)
    return [
        Fault("redis-ingest", "Redis restarted (shutdown nosave) mid-ingest", redis_mid_ingest),
        Fault("redis-brake", "Redis restarted, evaluation queued", redis_mid_brake),
        Fault(
            "postgres-ingest",
            "PostgreSQL restarted (1 s away) mid-ingest",
            postgres_mid_ingest,
            red_required=False,
        ),
        Fault(
            "postgres-away",
            f"PostgreSQL away {PG_AWAY:g} s > the pool's timeout",
            postgres_away(PG_AWAY),
            health_wait_within=PG_AWAY_HEALTH_WAIT,
        ),
        Fault(
            "failed-brake",
            "brake checkpoint fails (read-only directory)",
            failing_brake,
            brake_checkpoint_fails=True,
            red_required=False,
        ),
        Fault(
            "worker-eval",
            "Celery workers SIGKILLed, evaluation owed",
            worker_mid_evaluation,
        ),
        Fault(
            "worker-delivery",
            "Celery workers SIGKILLed mid-delivery",
            worker_mid_delivery,
            overlapped=page_held,
        ),
        Fault(
            "beat-down",
            f"leading beat killed for {beat_seconds:g} s",
            beat_down(beat_seconds),
            hung_within=BEAT_TAKEOVER_SECONDS,
            overlapped=beat_overlap,
            red_required=False,
        ),
        Fault("daphne-killed", "Daphne SIGKILLed and restarted", daphne_killed),
        Fault(
            "console-down",
            f"whole console down {console_seconds:g} s",
            console_down(console_seconds),
        ),
        Fault(
            "web-down",
            f"web tier down {web_seconds:g} s > heartbeat deadline",
            web_down(web_seconds),
            healthy_timeout=WEB_DOWN_HEALTHY_TIMEOUT,
            overlapped=web_overlap,
        ),
    ]


def run(
    keys: list[str],
    jobs: int,
    beat_seconds: float,
    console_seconds: float,
    stack: Stack | None = None,
) -> list[tuple[Fault, dict]]:
    chosen = [f for f in faults(beat_seconds, console_seconds) if not keys or f.key in keys]
    return run_chosen(chosen, jobs, stack, Stack)


def run_chosen(
    chosen: list[Fault], jobs: int, stack: Stack | None, make_stack: Callable[[], Stack]
) -> list[tuple[Fault, dict]]:
    """Each fault in turn on ``stack`` (or on one of ``make_stack``'s, started and closed
    here), with the figures of each."""
    own = stack is None
    stack = stack or make_stack()
    results = []
    try:
        if own:
            stack.start()
        created = create_jobs(stack, all_timeouts(chosen, jobs))
        with tempfile.TemporaryDirectory(prefix="brakeline-faults-spill-") as spill:
            for fault in chosen:
                started = time.monotonic()
                result = run_fault(stack, fault, jobs, Path(spill), created)
                result["seconds"] = time.monotonic() - started
                results.append((fault, result))
                print(f"{fault.key}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    finally:
        if own:
            stack.close()
    return results


def report(results: list[tuple[Fault, dict]], *extra: str) -> int:
    """Print the table (and ``extra`` lines) and, per fault, what did not overlap. The pass
    and fail criteria are the tests' (tests/faults/criteria.py); the exit status is 1 only
    when a fault could not be shown to have overlapped what it tests."""
    print(table(results))
    for line in extra:
        print(line)
    missed = {fault.key: result["overlap"] for fault, result in results if result["overlap"]}
    for key, why in missed.items():
        print(f"NOT OVERLAPPED {key}: {why}")
    return 1 if missed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("faults", nargs="*", help="fault keys (default: all)")
    parser.add_argument("--jobs", type=int, default=8, help="simulated jobs per fault (≥ 3)")
    parser.add_argument("--beat-down", type=float, default=20.0)
    parser.add_argument("--console-down", type=float, default=30.0)
    options = parser.parse_args()
    results = run(options.faults, max(3, options.jobs), options.beat_down, options.console_down)
    return report(results)


if __name__ == "__main__":
    sys.exit(main())
