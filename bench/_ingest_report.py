"""What bench/ingest.py measured, as tables: one result per measurement, and its printing."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from _stack import median


@dataclass
class Result:
    points_per_second: float
    lag_p95: float | None = None  # seconds; None: nothing is evaluated (MLflow, COPY)
    behind_at_end: int = 0  # points acknowledged but not evaluated when the load stopped
    drain_seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # µs of CPU per point, by process


def _range(results: list[Result]) -> str:
    rates = [r.points_per_second for r in results]
    return f"{median(rates) / 1000:6.1f}k [{min(rates) / 1000:.1f}–{max(rates) / 1000:.1f}]"


def _ratio(top: list[Result], bottom: list[Result]) -> str:
    ratios = [a.points_per_second / b.points_per_second for a, b in zip(top, bottom, strict=True)]
    return f"{median(ratios):6.2f} [{min(ratios):.2f}–{max(ratios):.2f}]"


def _cpu(results: list[Result]) -> str:
    names = sorted({name for r in results for name in r.cpu})
    shown = {name: median([r.cpu.get(name, 0.0) for r in results]) for name in names}
    return "  ".join(f"{name} {value:.1f}" for name, value in shown.items() if value >= 0.05)


def print_table(results: dict, clients: tuple[int, ...], mlflow_version: str) -> None:
    rows = [
        ("Brakeline (Daphne+HAProxy, prefork worker, beat)", "brakeline"),
        (f"MLflow {mlflow_version} server on PostgreSQL", "mlflow"),
        ("raw PostgreSQL COPY of the same rows", "copy"),
        ("… of the same points as blocks (ingest's layout)", "blocks"),
    ]
    print(
        f"\n{'points/s, median [min–max]':52}"
        + "".join(f"{c} client(s)".rjust(24) for c in clients)
    )
    for label, key in rows:
        if results.get((key, clients[0])):
            print(f"{label:52}" + "".join(_range(results[(key, c)]).rjust(24) for c in clients))
    for label, key, goal in (
        ("Brakeline / MLflow  (goal ≥ 10)", "mlflow", ""),
        ("Brakeline / COPY    (goal ≥ 0.5)", "copy", ""),
    ):
        if results.get((key, clients[0])):
            print(
                f"{label:52}"
                + "".join(
                    _ratio(results[("brakeline", c)], results[(key, c)]).rjust(24) for c in clients
                )
                + goal
            )
    print(
        f"{'evaluation lag p95, s (goal < 1)':52}"
        + "".join(
            f"{median([r.lag_p95 or 0.0 for r in results[('brakeline', c)]]):.2f} [max "
            f"{max(r.lag_p95 or 0.0 for r in results[('brakeline', c)]):.2f}]".rjust(24)
            for c in clients
        )
    )
    print(
        f"{'points behind when the load stopped (max)':52}"
        + "".join(
            f"{max(r.behind_at_end for r in results[('brakeline', c)]):,}".rjust(24)
            for c in clients
        )
    )
    print("\nCPU µs per point (median), by process:")
    for key in ("brakeline", "mlflow", "copy", "blocks"):
        for c in clients:
            if results.get((key, c)):
                print(f"  {key:10} {c} client(s): {_cpu(results[(key, c)])}")


def print_scaling(results: dict, webs: tuple[int, ...], clients: int) -> None:
    print(f"\nScale-out, {clients} clients (jobs), web processes behind HAProxy:")
    base = results[("scale", webs[0])]
    for web in webs:
        runs = results[("scale", web)]
        print(
            f"  {web} web: {_range(runs)} points/s   ×{_ratio(runs, base).strip()} of {webs[0]}"
            f"   lag p95 {median([r.lag_p95 or 0.0 for r in runs]):.2f} s"
            f"   behind at stop {max(r.behind_at_end for r in runs):,}"
            f"   CPU µs/pt: {_cpu(runs)}"
        )
        print(f"      {_cores(runs, web)}")


def _cores(runs: list[Result], web: int) -> str:
    """Which process is CPU-bound, and the ceiling the machine sets: the cores each process
    kept busy at the measured rate (µs per point × points/s), and what all of them together
    allow on this machine's cores at that CPU per point."""
    rate = median([r.points_per_second for r in runs])
    names = sorted({name for r in runs for name in r.cpu})
    per_point = {name: median([r.cpu.get(name, 0.0) for r in runs]) for name in names}
    busy = {name: value * rate / 1e6 for name, value in per_point.items()}
    cores = len(os.sched_getaffinity(0))
    total = sum(per_point.values())
    shown = ", ".join(
        f"{name} {busy[name]:.2f}" + (f" ({busy[name] / web:.2f} each)" if name == "web" else "")
        for name in sorted(busy, key=busy.get, reverse=True)
        if busy[name] >= 0.01
    )
    return (
        f"cores busy: {sum(busy.values()):.2f} of {cores} ({shown}); "
        f"all {cores} cores at {total:.0f} µs a point: {cores / total * 1e6 / 1000:.1f}k points/s"
    )


def print_small(results: dict, clients: int) -> None:
    """What a request costs whatever it carries: a big job's ranks send many small ones."""
    print(f"\nSmall requests, {clients} clients (jobs), 1 web process:")
    for kind, label in (("heartbeat", "heartbeat"), ("batch10", "10-point batch")):
        runs = results.get(("small", kind))
        if not runs:
            continue
        names = sorted({name for r in runs for name in r.cpu})
        ms = {name: median([r.cpu.get(name, 0.0) for r in runs]) / 1000 for name in names}
        shown = "  ".join(f"{name} {value:.2f}" for name, value in ms.items() if value >= 0.005)
        web = ms.get("web", 0.0)
        print(
            f"  {label:15} {median([r.points_per_second for r in runs]):7.0f} requests/s   "
            f"CPU ms/request: {shown}   (a core of web process: ~{1000 / web:.0f}/s)"
            if web
            else f"  {label}: no web CPU measured"
        )
