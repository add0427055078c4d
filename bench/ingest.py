"""Ingest throughput: points per second through the HTTP API vs raw COPY into the same table.

    make bench        (or: DATABASE_URL=… REDIS_URL=… python bench/ingest.py)

For batches of 100, 1,000 and 10,000 points and 1 and 4 concurrent clients it measures the
API (Daphne + Django + PostgreSQL, real HTTP over loopback, keep-alive connections) and, in the
same run, the raw ``COPY`` of the same points straight into ``breakers_metricpoint`` (the
physical limit on this machine). Each figure is the median of several repetitions; the ratio
API / raw is what the goal speaks of (≥ 0.5 at 1,000-point batches).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

from _stack import daphne, median, set_up_django

BATCH_SIZES = (100, 1_000, 10_000)
CLIENT_COUNTS = (1, 4)


def make_batch(size: int, offset: int) -> list[dict]:
    return [
        {
            "name": "loss" if i % 2 else "grad_norm",
            "step": offset + i // 2,
            "value": 1.0 + i * 1e-6,
            "node": "node-01",
        }
        for i in range(size)
    ]


def api_rate(
    base_url: str, token: str, batch: bytes, size: int, clients: int, seconds: float
) -> float:
    """Points per second accepted by the API with ``clients`` concurrent keep-alive clients."""
    parsed = urlparse(base_url)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    stop_at = time.monotonic() + seconds
    counts = [0] * clients

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
        connection.connect()
        # http.client sends headers and body in two writes; without NODELAY, Nagle's algorithm
        # holds the body back until the server's delayed ACK (what any tuned agent avoids).
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while time.monotonic() < stop_at:
            connection.request("POST", "/api/v1/agent/metrics", body=batch, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status != 202:
                raise RuntimeError(f"API answered {response.status}")
            counts[index] += size
        connection.close()

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return sum(counts) / (time.monotonic() - started)


def copy_rate(job_id: int, points: list, size: int, clients: int, seconds: float) -> float:
    """Points per second of raw COPY of the same points, ``clients`` connections in parallel."""
    import psycopg
    from django.conf import settings
    from django.utils import timezone

    from breakers.agent.store import copy_rows

    db = settings.DATABASES["default"]
    dsn = f"host={db['HOST']} port={db['PORT'] or 5432} user={db['USER']} dbname={db['NAME']}"
    now = timezone.now()
    rows = [(job_id, p["name"], p["step"], now, p["value"], p["node"], 0) for p in points]
    stop_at = time.monotonic() + seconds
    counts = [0] * clients

    def client(index: int) -> None:
        with psycopg.connect(dsn) as connection:
            while time.monotonic() < stop_at:
                with connection.transaction(), connection.cursor() as cursor:
                    copy_rows(cursor, rows)
                counts[index] += size

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return sum(counts) / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    set_up_django()
    from breakers.models import MetricPoint
    from incidents.jobs import create_job

    created = create_job("bench", f"ingest-{int(time.time())}")
    job_id, token = created.job.pk, created.raw_token
    print(f"{'batch':>7} {'clients':>7} {'API pts/s':>12} {'COPY pts/s':>12} {'API/COPY':>9}")
    with daphne({"BRAKELINE_AGENT_RATE": "1000000/min"}) as base_url:
        for size in BATCH_SIZES:
            points = make_batch(size, 0)
            body = json.dumps({"points": points}).encode()
            for clients in CLIENT_COUNTS:
                api, raw = [], []
                for _ in range(args.repeats):
                    api.append(api_rate(base_url, token, body, size, clients, args.seconds))
                    raw.append(copy_rate(job_id, points, size, clients, args.seconds))
                api_median, raw_median = median(api), median(raw)
                print(
                    f"{size:>7} {clients:>7} {api_median:>12,.0f} {raw_median:>12,.0f} "
                    f"{api_median / raw_median:>9.2f}",
                    flush=True,
                )
    MetricPoint.objects.filter(job_id=job_id).delete()
    threading.enumerate()


if __name__ == "__main__":
    main()
