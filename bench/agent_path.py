"""The console's CPU per agent request: the lean route against the DRF views, in one run.

Two web processes (Daphne) on one bench database: one with the lean route (the default), one
with ``BRAKELINE_AGENT_LEAN=0`` (every agent request through Django's middleware and DRF, the
baseline). One client sends ``--requests`` requests of a kind over one kept-alive connection to
one server, then the same to the other, kind after kind, round after round: interleaved, so a
busy neighbour on the machine weighs on both alike. Each measurement is the CPU the web process
spent over those requests (utime + stime from /proc), and the PostgreSQL backends' (the
database's share of the same work), divided by the requests. Printed: medians over the rounds
and the ratio baseline / lean. No timed assertion: the figures are read, not checked.

Kinds: a heartbeat; a metrics batch of 1 point; of 100 points; and what an SDK rank sends each
second under protocol 3, a batch of 10 points carrying its heartbeat.

No worker runs: the one evaluation per job the batches schedule waits in a queue of the
bench's own, deleted at the end. The rate limit is lifted for the run (both servers alike).

    python agent_path.py [--rounds 7] [--requests 300]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
from collections.abc import Callable
from itertools import count
from urllib.parse import urlsplit

from _prodstack import postgres_cpu, postgres_delta, process_cpu
from _stack import daphne_server, median, set_up_django

KINDS = ("heartbeat", "batch of 1", "batch of 100", "10 points + heartbeat")
HEARTBEAT = "/api/v1/agent/heartbeat"
METRICS = "/api/v1/agent/metrics"


def request_of(kind: str, steps: count) -> tuple[str, bytes]:
    """The path and body of one request of ``kind``, each at a new step."""
    step = next(steps)
    beat = {"step": step, "status": "running", "rank": 0, "world_size": 1}
    if kind == "heartbeat":
        return HEARTBEAT, json.dumps(beat).encode()
    size = {"batch of 1": 1, "batch of 100": 100, "10 points + heartbeat": 10}[kind]
    points = [{"name": f"m{i}", "step": step, "value": 1.0 / (i + step + 1)} for i in range(size)]
    body: dict = {"points": points}
    if kind == "10 points + heartbeat":
        body["heartbeat"] = beat
    return METRICS, json.dumps(body).encode()


class Server:
    """One web process, its job's token and a kept-alive connection to it."""

    def __init__(self, url: str, pid: int, token: str) -> None:
        parts = urlsplit(url)
        self.connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        self.pid = pid
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.steps = count(1)

    def send(self, kind: str) -> None:
        path, body = request_of(kind, self.steps)
        self.connection.request("POST", path, body=body, headers=self.headers)
        response = self.connection.getresponse()
        answer = response.read()
        if response.status >= 300:
            raise SystemExit(f"{path} answered {response.status}: {answer[:300]!r}")


def measured(server: Server, kind: str, requests: int, database_cpu: Callable) -> tuple:
    """(web, database) CPU milliseconds per request of ``kind``."""
    web, database = process_cpu(server.pid), database_cpu()
    for _ in range(requests):
        server.send(kind)
    web_ms = (process_cpu(server.pid) - web) * 1000 / requests
    database_ms = postgres_delta(database, database_cpu()) * 1000 / requests
    return web_ms, database_ms


def new_token(name: str) -> str:
    from incidents.jobs import create_job

    return create_job("bench", f"{name}-{os.getpid()}", "training").raw_token


def run(rounds: int, requests: int) -> dict:
    import psycopg

    url = os.environ["DATABASE_URL"]  # the bench database, once set_up_django has run
    admin = psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True)
    database = url.rsplit("/", 1)[1]
    results: dict = {(door, kind): [] for door in ("drf", "lean") for kind in KINDS}
    common = {"BRAKELINE_AGENT_RATE": "100000000/min", "BRAKELINE_CELERY_QUEUE": QUEUE}
    with (
        daphne_server(common | {"BRAKELINE_AGENT_LEAN": "0"}) as (drf_url, drf_pid),
        daphne_server(common | {"BRAKELINE_AGENT_LEAN": "1"}) as (lean_url, lean_pid),
    ):
        servers = {
            "drf": Server(drf_url, drf_pid, new_token("drf")),
            "lean": Server(lean_url, lean_pid, new_token("lean")),
        }
        for server in servers.values():  # warm up: imports, connections, the pool
            for kind in KINDS:
                for _ in range(20):
                    server.send(kind)
        for _ in range(rounds):
            for kind in KINDS:
                for door, server in servers.items():
                    cpu = measured(server, kind, requests, lambda: postgres_cpu(admin, [database]))
                    results[(door, kind)].append(cpu)
    return results


def report(results: dict, rounds: int, requests: int) -> None:
    print(f"CPU per agent request, median of {rounds} rounds of {requests} requests (ms)")
    print(f"{'kind':<24}{'DRF web':>9}{'lean web':>10}{'ratio':>7}{'DRF db':>9}{'lean db':>9}")
    for kind in KINDS:
        drf = [median([cpu[i] for cpu in results[("drf", kind)]]) for i in (0, 1)]
        lean = [median([cpu[i] for cpu in results[("lean", kind)]]) for i in (0, 1)]
        ratio = drf[0] / lean[0] if lean[0] else float("inf")
        print(
            f"{kind:<24}{drf[0]:>9.2f}{lean[0]:>10.2f}{ratio:>6.1f}×{drf[1]:>9.2f}{lean[1]:>9.2f}"
        )


QUEUE = f"agent-path-bench-{os.getpid()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    set_up_django()
    try:
        results = run(args.rounds, args.requests)
    finally:
        from core.redis_clients import redis_client

        redis_client().delete(QUEUE)
    report(results, args.rounds, args.requests)


if __name__ == "__main__":
    main()
