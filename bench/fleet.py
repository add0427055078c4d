"""A fleet of simulated ranks against the production stack: what one rank costs the console.

    make bench-fleet
    (or, from bench/: DATABASE_URL=… REDIS_URL=… python fleet.py --ranks 50,100)

The stack is the production process shape (bench/_prodstack.py): Daphne behind HAProxy, a
prefork Celery worker (one child per core), beat, PostgreSQL and Redis. The ranks
(bench/_fleet_sim.py) speak the SDK's wire protocol at its defaults: a step every 0.25 s,
metrics flushed every second with batch ids, heartbeats every 5 s, a websocket per rank,
one HTTP connection per request; in the ``node`` variant each node's ranks
(``--ranks-per-node``, 8) speak through one forwarder: a bundle per interval and one
websocket per node (protocol 4). All ranks of a round are one job.

Each round: a fresh job of N ranks, ``--warm`` seconds unmeasured, ``--seconds`` measured
(CPU of every process tree from /proc, requests by kind and answer, evaluation lag sampled
every 50 ms), then a NaN loss on one rank: every rank's step guard holds, the rules brake,
and the clock runs until the last rank's acknowledged hold (``checkpoint_and_pause`` at one
step). Printed per rank count: requests/s, console CPU in ms per rank-second by process,
evaluation lag p50/p95, NaN → every rank held p50/p95/max over rounds (and over ranks),
and the cores 1,000 and 10,000 ranks would need at the measured per-rank cost (an
extrapolation: linear in ranks, which is what the per-rank cost being flat across the
measured rank counts says, or not).

The machine is shared: compare figures of one run with each other, not with another run's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections import Counter

os.environ.setdefault("BRAKELINE_CELERY_QUEUE", "brakeline-bench-fleet")
os.environ.setdefault("BRAKELINE_CHANNEL_PREFIX", "brakeline-bench-fleet")

from _fleet_sim import Fleet, FleetConfig, Traffic  # noqa: E402
from _prodstack import own_cpu, postgres_cpu, postgres_delta, stack  # noqa: E402
from _stack import percentile, set_up_django  # noqa: E402
from ingest import Acks, LagWatch  # noqa: E402

PROCESSES = ("web", "worker", "postgres", "beat", "haproxy")


def new_job(ranks: int) -> tuple[int, str]:
    from incidents.jobs import create_job

    created = create_job("bench-fleet", f"fleet-{ranks}-{time.time_ns()}")
    return created.job.pk, created.raw_token


def cpu_reading(running, connection, dsn_name: str) -> dict:
    return {
        **running.cpu(),
        "postgres_pids": postgres_cpu(connection, [dsn_name]),
        "client": own_cpu(),
    }


def cpu_delta(before: dict, after: dict) -> dict[str, float]:
    delta = {name: after[name] - before[name] for name in ("web", "worker", "beat", "haproxy")}
    delta["postgres"] = postgres_delta(before["postgres_pids"], after["postgres_pids"])
    delta["client"] = after["client"] - before["client"]
    return delta


async def one_round(args, running, connection, db_name: str, ranks: int, variant: str) -> dict:
    job_id, token = await asyncio.to_thread(new_job, ranks)
    riding = variant in ("riding", "node")  # a node's ranks are of protocol 4: they ride
    config = FleetConfig(
        url=running.urls[args.web],
        token=token,
        ranks=ranks,
        websocket=not args.no_websocket,
        metrics=args.metrics,
        heartbeat_in_batch=riding,
        ranks_per_node=args.ranks_per_node,
        node_bundles=variant == "node",
    )
    acks = Acks()
    traffic = Traffic(on_accepted=acks.add)
    fleet = Fleet(config, traffic)
    fleet.start()
    await asyncio.sleep(args.warm)
    with LagWatch(os.environ["DATABASE_URL"], [job_id], [acks]) as watch:
        requests_before = sum(traffic.requests.values())
        parts_before = traffic.parts
        points_before = traffic.accepted_points
        by_kind_before = traffic.requests.copy()
        before = cpu_reading(running, connection, db_name)
        started = time.monotonic()
        await asyncio.sleep(args.seconds)
        elapsed = time.monotonic() - started
        after = cpu_reading(running, connection, db_name)
        requests = sum(traffic.requests.values()) - requests_before
        parts = traffic.parts - parts_before
        points = traffic.accepted_points - points_before
        by_kind = traffic.requests - by_kind_before
        lag_samples = list(watch.samples)
    nan_step = fleet.inject_nan()
    held = await fleet.wait_held(args.hold_timeout)
    nan_at = traffic.nan_at or time.monotonic()
    per_rank = [at - nan_at for _, at in traffic.acked.values()]
    steps = {step for step, _ in traffic.acked.values()}
    await fleet.close()
    if os.environ.get("FLEET_DEBUG"):
        print(dict(traffic.requests), sorted(per_rank))
    return {
        "elapsed": elapsed,
        # Rank-seconds of training the console kept up with: points accepted over what one
        # rank logs a second (a saturated console serves fewer than the wall clock's).
        "served": points / (config.metrics / config.step_seconds),
        "requests": requests,
        "parts": parts,
        "by_kind": by_kind,
        "cpu": cpu_delta(before, after),
        "lag": lag_samples,
        "held": held,
        "held_ranks": len(traffic.acked),
        "steps": steps,
        "all_held": max(per_rank) if held and per_rank else None,
        "per_rank": per_rank,
        "errors": traffic.errors,
        "ranks": ranks,
        "nan_step": nan_step,
    }


def _parts_per_bundle(rounds: list[dict]) -> float | None:
    bundles = sum(r["by_kind"].get(("bundle", 200), 0) for r in rounds)
    return sum(r["parts"] for r in rounds) / bundles if bundles else None


def summarise(rounds: list[dict]) -> dict:
    ranks = rounds[0]["ranks"]
    rank_seconds = sum(r["elapsed"] for r in rounds) * ranks
    cpu = {name: sum(r["cpu"][name] for r in rounds) for name in (*PROCESSES, "client")}
    served = sum(r["served"] for r in rounds)
    requests = sum(r["requests"] for r in rounds)
    statuses: dict = {}
    for r in rounds:
        for (kind, status), count in r["by_kind"].items():
            statuses.setdefault(kind, {}).setdefault(status, 0)
            statuses[kind][status] += count
    lag = [s for r in rounds for s in r["lag"]] or [0.0]
    alls = [r["all_held"] for r in rounds if r["all_held"] is not None]
    per_rank = [s for r in rounds for s in r["per_rank"]]
    return {
        "ranks": ranks,
        "rps": sum(r["requests"] for r in rounds) / sum(r["elapsed"] for r in rounds),
        "parts_per_bundle": _parts_per_bundle(rounds),
        "ms_per_rank_s": {name: 1000 * seconds / rank_seconds for name, seconds in cpu.items()},
        "ms_per_served": {name: 1000 * seconds / served for name, seconds in cpu.items()},
        "ms_per_request": {name: 1000 * seconds / requests for name, seconds in cpu.items()},
        "served_share": served / rank_seconds,
        "statuses": statuses,
        "lag": (statistics.median(lag), percentile(lag, 0.95)),
        "all_held": alls,
        "per_rank": per_rank,
        "missed": [r for r in rounds if not r["held"]],
        "one_step": all(len(r["steps"]) == 1 for r in rounds if r["held"]),
        "at_nan_step": sum(r["steps"] == {r["nan_step"]} for r in rounds),
        "errors": sum((r["errors"] for r in rounds), start=Counter()),
        "rounds": len(rounds),
    }


def print_tables(results: list[dict], args, variant: str) -> None:
    print(
        f"\nFleet: one job of N ranks, SDK defaults (step 0.25 s, flush 1 s, heartbeat 5 s), "
        f"websocket {'off' if args.no_websocket else 'on'}, heartbeats "
        f"{variant}, {args.seconds:g} s measured per round\n"
    )
    print("ranks | req/s | req/s/rank | parts/bundle | answers by kind")
    for res in results:
        answers = "; ".join(
            f"{kind} "
            + ", ".join(f"{status}:{count}" for status, count in sorted(s.items(), key=str))
            for kind, s in sorted(res["statuses"].items())
        )
        per_bundle = res["parts_per_bundle"]
        bundled = f"{per_bundle:12.1f}" if per_bundle else f"{'-':>12}"
        print(
            f"{res['ranks']:5d} | {res['rps']:6.1f} | {res['rps'] / res['ranks']:5.2f} "
            f"| {bundled} | {answers}"
        )
    print(
        "\nconsole CPU, ms per rank-second served (rank-seconds of points accepted; the wall"
        " clock's\nrank-seconds when the console keeps up) and per request; client: the simulator"
    )
    print("ranks | served |    web | worker | postgres |  beat |  TOTAL | per request | client")
    for res in results:
        ms, per = res["ms_per_served"], res["ms_per_request"]
        total = sum(ms[name] for name in PROCESSES)
        print(
            f"{res['ranks']:5d} | {res['served_share']:5.0%} | {ms['web']:6.2f} "
            f"| {ms['worker']:6.2f} | {ms['postgres']:8.2f} | {ms['beat']:5.2f} | {total:6.2f} "
            f"| {sum(per[name] for name in PROCESSES):8.2f} ms | {ms['client']:6.2f}"
        )
    print("\nevaluation lag and NaN → every rank's acknowledged hold")
    print("ranks | lag p50 | lag p95 | all held p50 | p95 | max | per rank p50/p95 | rounds held")
    for res in results:
        alls, per = res["all_held"], res["per_rank"]
        fmt = (lambda v: f"{v:6.2f}") if alls else (lambda v: "   n/a")
        p50 = statistics.median(alls) if alls else 0
        p95 = percentile(alls, 0.95) if alls else 0
        per_text = f"{statistics.median(per):.2f}/{percentile(per, 0.95):.2f}" if per else "n/a"
        held = res["rounds"] - len(res["missed"])
        worst = max(alls) if alls else 0
        print(
            f"{res['ranks']:5d} | {res['lag'][0]:6.2f}s | {res['lag'][1]:6.2f}s | {fmt(p50)}s "
            f"| {fmt(p95)}s | {fmt(worst)}s | {per_text} s | {held}/{res['rounds']}"
            f"{'' if res['one_step'] else ' (NOT at one step)'}"
            f", {res['at_nan_step']} at the NaN's step"
        )
        for missed in res["missed"]:
            print(f"      a round held only {missed['held_ranks']} of {res['ranks']} ranks")
        if res["errors"]:
            print(f"      client errors: {dict(res['errors'])}")
    print("\ncores needed, extrapolated linearly from the measured per-rank cost")
    print("measured at | ms/rank-s | 1,000 ranks | 10,000 ranks")
    for res in results:
        total = sum(res["ms_per_rank_s"][name] for name in PROCESSES)
        print(
            f"{res['ranks']:5d} ranks | {total:9.2f} | {total:8.1f} cores | {total * 10:9.0f} cores"
        )


async def run(args) -> dict[str, list[dict]]:
    """Every variant's rounds interleaved (a round of each, then the next round), so the
    machine's other load falls on each alike."""
    import psycopg

    db_name = os.environ["DATABASE_URL"].rsplit("/", 1)[1]
    results: dict[str, list[dict]] = {variant: [] for variant in args.variants}
    with (
        stack(args.web, {}) as running,
        psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as connection,
    ):
        for ranks in args.ranks:
            rounds: dict[str, list[dict]] = {variant: [] for variant in args.variants}
            for index in range(args.rounds):
                for variant in args.variants:
                    outcome = await one_round(args, running, connection, db_name, ranks, variant)
                    rounds[variant].append(outcome)
                    print(
                        f"  {ranks} ranks, {variant}, round {index + 1}: held "
                        f"{outcome['held_ranks']}/{ranks} in "
                        f"{outcome['all_held'] or float('nan'):.2f} s",
                        flush=True,
                    )
            for variant in args.variants:
                results[variant].append(summarise(rounds[variant]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[50, 100])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warm", type=float, default=10.0)
    parser.add_argument("--metrics", type=int, default=3, help="values logged per step")
    parser.add_argument("--web", type=int, default=1, help="Daphne processes behind HAProxy")
    parser.add_argument("--no-websocket", action="store_true")
    parser.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=["separate", "riding", "node"],
        help="separate: heartbeats on their own (protocol 2 SDKs); riding: a due heartbeat "
        "rides in the metrics batch (protocol 3); node: riding, and each node's ranks speak "
        "through one forwarder, one bundle per interval and one websocket (protocol 4)",
    )
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument("--hold-timeout", type=float, default=60.0)
    args = parser.parse_args()
    set_up_django()
    from config.celery import app

    app.control.purge()
    from incidents.models import Job

    # Earlier runs' jobs were braked and never resumed: terminated, so no tick carries them.
    Job.objects.filter(team__name="bench-fleet").exclude(status="terminated").update(
        status="terminated", heartbeat_deadline=None
    )
    for variant, results in asyncio.run(run(args)).items():
        print_tables(results, args, variant)


if __name__ == "__main__":
    main()
