"""Scale-out, run: N Daphne processes behind the shipped HAProxy config, M Celery workers, and
one job of R simulated ranks speaking through their nodes' forwarders.

    make bench-scaleout
    (or, from bench/: DATABASE_URL=… python scaleout.py --configs 1x1,2x2 --ranks 200)

Each configuration (``WEBxWORKERS``: ``2x2`` is two Daphnes and two worker processes) is a
fresh production stack (bench/_prodstack.py): the Daphnes behind HAProxy running
deploy/haproxy.cfg (its global, defaults and backend sections as shipped; only the listening
port and the servers' addresses are the benchmark's), the workers (``--concurrency`` children
each, 1 by default so that "2 workers" is two evaluating processes, not four), beat,
PostgreSQL, and a Redis server of the benchmark's own (the machine's Redis serves other work,
so its CPU could not be told apart). The ranks (bench/_fleet_sim.py) speak the SDK's protocol
at its defaults in node mode: each node's local rank 0 forwards its ranks' requests in one
bundle per flush interval and holds the node's one websocket, through HAProxy.

Per configuration: requests/s, console CPU in ms per rank-second by process kind (web, worker,
PostgreSQL, Redis, HAProxy, beat; the simulator apart), evaluation lag p50/p95, and after a NaN
on one rank every rank's acknowledged hold p50/p95/max (over ranks), with how many ranks heard
the brake on their node's websocket. Then how one job's evaluation spread over the workers (CPU
of each, and how often a backend waited on a lock), and the cores 1,000 and 10,000 ranks would
need at the measured per-rank cost (an extrapolation).

The machine is shared: compare figures of one run with each other. CPU time is the robust
figure; lag and hold times move with the machine's other load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import threading
import time

os.environ.setdefault("BRAKELINE_CELERY_QUEUE", "brakeline-bench-scaleout")
os.environ.setdefault("BRAKELINE_CHANNEL_PREFIX", "brakeline-bench-scaleout")

from _fleet_sim import Fleet, FleetConfig, Traffic  # noqa: E402
from _prodstack import (  # noqa: E402
    own_cpu,
    postgres_cpu,
    postgres_delta,
    private_redis,
    process_cpu,
    stack,
    tree_cpu,
)
from _stack import percentile, set_up_django  # noqa: E402
from ingest import Acks, LagWatch  # noqa: E402

KINDS = ("web", "worker", "postgres", "redis", "haproxy", "beat")


class LockWatch:
    """Samples, every 50 ms, whether a backend of the benchmark's database waits on a lock
    (the evaluator's row lock on its job's state is the one expected with several workers)."""

    def __init__(self, dsn: str, database: str) -> None:
        self.dsn, self.database = dsn, database
        self.samples = self.waiting = self.evaluator = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LockWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psycopg

        query = (
            "SELECT count(*), count(*) FILTER (WHERE query ILIKE '%%evaluationstate%%') "
            "FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'"
        )
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            while not self._stop.is_set():
                count, evaluator = connection.execute(query, [self.database]).fetchone()
                self.samples += 1
                self.waiting += count > 0
                self.evaluator += evaluator > 0
                self._stop.wait(0.05)


def new_job(heartbeat_timeout: float | None) -> tuple[int, str]:
    """A fresh job; with ``heartbeat_timeout``, its own deadline instead of the console's
    (to measure the NaN's brake alone on a console too slow for the 10 s floor)."""
    from incidents.jobs import create_job
    from incidents.models import Job

    created = create_job("bench-scaleout", f"scaleout-{time.time_ns()}")
    if heartbeat_timeout:
        Job.objects.filter(pk=created.job.pk).update(heartbeat_timeout_seconds=heartbeat_timeout)
    return created.job.pk, created.raw_token


def reading(running, connection, database: str, redis_pid: int) -> dict:
    workers = [p for name, p in running.others.items() if name.startswith("worker")]
    return {
        **running.cpu(),
        "workers": [tree_cpu(p.pid) for p in workers],
        "redis": process_cpu(redis_pid),
        "postgres_pids": postgres_cpu(connection, [database]),
        "client": own_cpu(),
        "at": time.monotonic(),
    }


def delta(before: dict, after: dict) -> dict:
    spent = {name: after[name] - before[name] for name in (*KINDS, "client") if name != "postgres"}
    spent["postgres"] = postgres_delta(before["postgres_pids"], after["postgres_pids"])
    spent["workers"] = [b - a for a, b in zip(before["workers"], after["workers"], strict=True)]
    spent["elapsed"] = after["at"] - before["at"]
    return spent


async def measured(args, running, connection, traffic: Traffic, job_id: int, acks) -> dict:
    """``--seconds`` of the job's steady state: CPU, requests, points, lag and lock waits."""
    database = os.environ["DATABASE_URL"].rsplit("/", 1)[1]
    dsn = os.environ["DATABASE_URL"]
    with LagWatch(dsn, [job_id], [acks]) as lag, LockWatch(dsn, database) as locks:
        requests, points = sum(traffic.requests.values()), traffic.accepted_points
        before = reading(running, connection, database, args.redis_pid)
        await asyncio.sleep(args.seconds)
        after = reading(running, connection, database, args.redis_pid)
        requests = sum(traffic.requests.values()) - requests
        points = traffic.accepted_points - points
    return {
        "cpu": delta(before, after),
        "requests": requests,
        "points": points,
        "lag": list(lag.samples) or [0.0],
        "lock_share": locks.waiting / max(1, locks.samples),
        "evaluator_share": locks.evaluator / max(1, locks.samples),
    }


async def one_round(args, running, connection, url: str) -> dict:
    job_id, token = await asyncio.to_thread(new_job, args.heartbeat_timeout)
    config = FleetConfig(
        url=url,
        token=token,
        ranks=args.ranks,
        ranks_per_node=args.ranks_per_node,
        heartbeat_in_batch=True,
        node_bundles=True,
    )
    acks = Acks()
    traffic = Traffic(on_accepted=acks.add)
    fleet = Fleet(config, traffic)
    fleet.start()
    await asyncio.sleep(args.warm)
    steps = sum(rank.step for rank in fleet.ranks)
    steady = await measured(args, running, connection, traffic, job_id, acks)
    # The simulator's own pace: steps its ranks took against the SDK's cadence (a simulator
    # short of CPU falls behind, and then sends less than real ranks would).
    expected = args.ranks * steady["cpu"]["elapsed"] / config.step_seconds
    steady["pace"] = (sum(rank.step for rank in fleet.ranks) - steps) / expected
    fleet.inject_nan()
    held = await fleet.wait_held(args.hold_timeout)
    nan_at = traffic.nan_at or time.monotonic()
    await fleet.close()
    return {
        **steady,
        "ranks": args.ranks,
        "held": len(traffic.acked),
        "hold": sorted(at - nan_at for _, at in traffic.acked.values() if at >= nan_at),
        # Ranks braked before any NaN: the console, too slow to record their heartbeats in
        # time, judged them silent (heartbeat-timeout, whose action is checkpoint_and_pause).
        "early": sum(at < nan_at for _, at in traffic.acked.values()),
        "steps": {step for step, _ in traffic.acked.values()},
        "all_held": held,
        "pushed": sum(1 for rank in range(args.ranks) if traffic.pushed[rank]),
        "errors": dict(traffic.errors),
        "points_per_rank_s": config.metrics / config.step_seconds,
    }


def row(config: str, outcome: dict) -> dict:
    cpu, ranks = outcome["cpu"], outcome["ranks"]
    # Rank-seconds of training whose points the console accepted: a console that does not
    # keep up serves fewer than the wall clock's, and its CPU is spread over those.
    served_seconds = outcome["points"] / outcome["points_per_rank_s"]
    served = served_seconds / (cpu["elapsed"] * ranks)
    per = 1000 / served_seconds if served_seconds else float("nan")  # nothing served: no cost
    ms = {kind: cpu[kind] * per for kind in (*KINDS, "client")}
    hold = outcome["hold"] or [float("nan")]
    return {
        "config": config,
        "ranks": ranks,
        "rps": outcome["requests"] / cpu["elapsed"],
        "served": served,
        "pace": outcome["pace"],
        "ms": ms,
        "total": sum(ms[kind] for kind in KINDS),
        "cores": sum(cpu[kind] for kind in KINDS) / cpu["elapsed"],
        "lag": (statistics.median(outcome["lag"]), percentile(outcome["lag"], 0.95)),
        "hold": (statistics.median(hold), percentile(hold, 0.95), max(hold)),
        "held": outcome["held"],
        "early": outcome["early"],
        "one_step": len(outcome["steps"]) == 1,
        "pushed": outcome["pushed"],
        "workers": cpu["workers"],
        "elapsed": cpu["elapsed"],
        "lock_share": outcome["lock_share"],
        "evaluator_share": outcome["evaluator_share"],
        "errors": outcome["errors"],
    }


def print_rows(rows: list[dict], args) -> None:
    print(
        f"\nScale-out: one job of N ranks in node mode ({args.ranks_per_node} ranks per node, "
        f"SDK defaults), through HAProxy, {args.seconds:g} s measured\n"
    )
    print("pace: steps the simulated ranks took against the SDK's cadence; served: rank-seconds")
    print("of points the console accepted against the wall clock's")
    print("config | ranks | req/s | pace | served | ms of CPU per rank-second served:")
    print(
        "       |       |       |      |        |   web | worker | postgres | redis | haproxy "
        "| beat | TOTAL | simulator | console cores busy"
    )
    for r in rows:
        ms = r["ms"]
        print(
            f"{r['config']:>6} | {r['ranks']:5d} | {r['rps']:5.0f} | {r['pace']:4.0%} "
            f"| {r['served']:5.0%}  "
            f"| {ms['web']:5.2f} | {ms['worker']:6.2f} | {ms['postgres']:8.2f} "
            f"| {ms['redis']:5.2f} | {ms['haproxy']:7.2f} | {ms['beat']:4.2f} "
            f"| {r['total']:5.2f} | {ms['client']:5.2f} | {r['cores']:.2f}"
        )
    print("\nevaluation lag and NaN on one rank → every rank's acknowledged hold (over ranks)")
    print(
        "config | ranks | lag p50 | lag p95 | hold p50 | p95 | max | held | at one step "
        "| heard on websocket"
    )
    for r in rows:
        print(
            f"{r['config']:>6} | {r['ranks']:5d} | {r['lag'][0]:6.2f}s | {r['lag'][1]:6.2f}s "
            f"| {r['hold'][0]:7.2f}s | {r['hold'][1]:5.2f}s | {r['hold'][2]:5.2f}s "
            f"| {r['held']}/{r['ranks']} | {'yes' if r['one_step'] else 'NO'} "
            f"| {r['pushed']}/{r['ranks']}"
        )
        if r["early"]:
            print(
                f"       {r['early']} ranks were braked before the NaN: the console judged them"
                " silent (heartbeat-timeout), too slow to record their heartbeats in time"
            )
        if r["errors"]:
            print(f"       client errors: {r['errors']}")
    print_evaluation(rows)
    print("\ncores of console needed, extrapolated linearly from the measured per-rank cost")
    print("config | ranks | ms/rank-s | 1,000 ranks | 10,000 ranks")
    for r in rows:
        print(
            f"{r['config']:>6} | {r['ranks']:5d} | {r['total']:9.2f} | {r['total']:6.1f} cores "
            f"| {r['total'] * 10:7.0f} cores"
        )


def print_evaluation(rows: list[dict]) -> None:
    """How one job's evaluation spread over the workers: each worker's share of the cores
    while measured, and how often a backend of the job's database waited on a lock."""
    print("\none job's evaluation over the workers: cores each worker kept busy, and the share")
    print("of 50 ms samples in which a backend waited on a lock (any; the evaluator's state row)")
    print("and the worker CPU one job of 10,000 ranks would need: its evaluation is serialised")
    print("(one worker process at a time holds the job's evaluation state), so above 1 core it")
    print("cannot keep up however many workers there are")
    print("config | ranks | worker cores | any lock wait | evaluator waiting | 10,000 ranks")
    for r in rows:
        cores = " + ".join(f"{seconds / r['elapsed']:.2f}" for seconds in r["workers"])
        print(
            f"{r['config']:>6} | {r['ranks']:5d} | {cores:>12} | {r['lock_share']:13.1%} "
            f"| {r['evaluator_share']:17.1%} | {r['ms']['worker'] * 10:.1f} cores"
        )


async def run(args) -> list[dict]:
    import psycopg

    rows = []
    for config in args.configs:
        web, workers = (int(n) for n in config.split("x"))
        with (
            stack(web, {}, workers=workers, concurrency=args.concurrency) as running,
            psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as connection,
        ):
            for index in range(args.rounds):
                outcome = await one_round(args, running, connection, running.urls[web])
                rows.append(row(config, outcome))
                print(
                    f"  {config}, {args.ranks} ranks, round {index + 1}: "
                    f"{outcome['held']}/{args.ranks} held",
                    flush=True,
                )
    return rows


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=lambda s: s.split(","), default=["1x1", "2x2"])
    parser.add_argument("--ranks", type=int, default=200)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warm", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=1, help="children per worker")
    parser.add_argument("--hold-timeout", type=float, default=90.0)
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=None,
        help="the job's own heartbeat deadline in seconds (default: the console's)",
    )
    return parser.parse_args()


def main() -> None:
    args = arguments()
    with private_redis() as (url, redis):
        os.environ["REDIS_URL"] = url
        args.redis_pid = redis.pid
        set_up_django()
        from incidents.models import Job

        # Earlier runs' jobs were braked and never resumed: terminated, so no tick carries them.
        Job.objects.filter(team__name="bench-scaleout").exclude(status="terminated").update(
            status="terminated", heartbeat_deadline=None
        )
        print_rows(asyncio.run(run(args)), args)


if __name__ == "__main__":
    main()
