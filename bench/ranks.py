"""The cost of a heartbeat as the job grows ranks: ``record_heartbeat`` (the one heartbeat
service, behind the HTTP front door) for jobs of 1, 64 and 1024 ranks, every rank beating in
turn, on real PostgreSQL. Prints the median and p95 per heartbeat and the ratio to one rank.

    DATABASE_URL=postgresql://…/brakeline python bench/ranks.py

Each heartbeat locks its job's row, writes its rank's row, reads the job's earliest rank
deadline (an index probe on (job, heartbeat_deadline)) and saves the job: the ratio should
stay near 1 however many ranks the job has.
"""

from __future__ import annotations

import time

from _stack import median, percentile, set_up_django


def measure(world_size: int, rounds: int) -> list[float]:
    from incidents.heartbeats import record_heartbeat
    from incidents.jobs import create_job

    job = create_job("bench-ranks", f"ranks-{world_size}-{time.time_ns()}").job
    timings = []
    for round_ in range(rounds):
        for rank in range(world_size):
            start = time.perf_counter()
            record_heartbeat(
                job.pk,
                step=round_,
                status="running",
                rank=rank,
                world_size=world_size,
                pid=10_000 + rank,
                hostname=f"node-{rank // 8}",
            )
            timings.append(time.perf_counter() - start)
    return timings[world_size:]  # the first round creates the rows


def main() -> None:
    set_up_django()
    measure(8, 20)  # warm the connection, the caches and the plans first
    baseline = None
    for world_size, rounds in ((1, 400), (64, 8), (1024, 2)):
        timings = measure(world_size, rounds)
        middle = median(timings) * 1000
        baseline = baseline or middle
        print(
            f"{world_size:5d} ranks: median {middle:.2f} ms, "
            f"p95 {percentile(timings, 0.95) * 1000:.2f} ms per heartbeat, "
            f"{middle / baseline:.2f}x one rank ({len(timings)} heartbeats)"
        )


if __name__ == "__main__":
    main()
