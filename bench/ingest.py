"""Ingest throughput as production runs it, side by side with MLflow and raw COPY.

    make bench        (or: DATABASE_URL=… REDIS_URL=… BRAKELINE_CELERY_QUEUE=… python ingest.py)

Brakeline runs in the production process shape (bench/_prodstack.py, as docker-compose.yml
runs it): Daphne behind HAProxy, a Celery worker with the prefork pool, Celery beat; nothing
is stopped, so every point is evaluated while it is measured. Each client is one training job
sending 1,000-point batches (10 metrics × 100 steps, with time and node, as the SDK encodes
them) over a keep-alive connection. In the same run, in interleaved rounds:

* MLflow 3.x's tracking server on PostgreSQL (bench/_mlflow.py: installed from PyPI into its
  own venv, its own database), the same points through its REST ``runs/log-batch``, one run
  per client;
* raw PostgreSQL ``COPY`` (binary) of the same rows into the same table, one connection per
  client: the floor of what PostgreSQL takes in with this row layout;
* the same points COPYed as blocks (one ``MetricBlock`` row per batch and rank), the layout
  ingest writes: the floor of what PostgreSQL takes in with it.

Printed: points/s (median [min–max] over the rounds) for 1 and 4 clients, the ratios against
MLflow and COPY, the evaluation lag (p95 seconds by which evaluation trails the
acknowledgement of a batch, sampled every 50 ms until caught up), the CPU each process spent
per point, the scale-out from 1 to 2 web processes with 4 clients, and what a small request
(a heartbeat, a batch of one step) costs whatever it carries.
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import json
import os
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import urlparse

import _mlflow
from _ingest_report import Result, print_scaling, print_small, print_table
from _prodstack import own_cpu, postgres_cpu, postgres_delta, stack, tree_cpu
from _stack import percentile, set_up_django

METRICS, STEPS = 10, 100
BATCH = METRICS * STEPS
NAMES = [f"train/metric_{index}" for index in range(METRICS)]
NAMES[0] = "train/loss"
NODE = "node-0001"
STEP_SECONDS = 0.001  # each step its own time, as a training loop stamps them
DROPPED: dict[str, int] = {}  # connections a server cut, by endpoint


def brakeline_body(offset: int, base: float, run: str = "bench") -> bytes:
    """A batch as the SDK writes it, with its batch id (breakers/agent/points.py parses it)."""
    parts = []
    for step in range(offset, offset + STEPS):
        moment = datetime.fromtimestamp(base + step * STEP_SECONDS, tz=UTC)
        tail = f',"time":"{moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}","node":"{NODE}"}}'
        parts.extend(
            f'{{"name":"{name}","step":{step},"value":{_value(step, index)!r}{tail}'
            for index, name in enumerate(NAMES)
        )
    return (f'{{"batch":"{run}-{offset}","points":[' + ",".join(parts) + "]}").encode()


def mlflow_body(run_id: str, offset: int, base: float) -> bytes:
    metrics = [
        {
            "key": name,
            "value": _value(step, index),
            "timestamp": int((base + step * STEP_SECONDS) * 1000),
            "step": step,
        }
        for step in range(offset, offset + STEPS)
        for index, name in enumerate(NAMES)
    ]
    return json.dumps({"run_id": run_id, "metrics": metrics}).encode()


def copy_batch(job_id: int, offset: int, base: float) -> list[tuple]:
    return [
        (
            job_id,
            name,
            step,
            datetime.fromtimestamp(base + step * STEP_SECONDS, tz=UTC),
            _value(step, index),
            NODE,
            0,  # rank
        )
        for step in range(offset, offset + STEPS)
        for index, name in enumerate(NAMES)
    ]


def _value(step: int, index: int) -> float:
    # A slowly falling loss and steady metrics: healthy, so no rule brakes the job mid-run.
    return round(2.0 / (1 + step * 1e-4) + index * 0.01 + (step % 7) * 1e-3, 6)


@dataclass
class Acks:
    """When each batch of one job was acknowledged: (monotonic time, points so far)."""

    times: list[float] = field(default_factory=list)
    totals: list[int] = field(default_factory=list)

    def add(self, count: int) -> None:
        self.totals.append((self.totals[-1] if self.totals else 0) + count)
        self.times.append(time.monotonic())

    def lag(self, evaluated: int, now: float) -> float:
        """Seconds since the oldest acknowledged point not evaluated yet was acknowledged."""
        index = bisect.bisect_right(self.totals, evaluated)
        return 0.0 if index >= len(self.times) else now - self.times[index]


def _http_client(url: str):
    parsed = urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    connection.connect()
    # http.client writes headers and body separately: without NODELAY, Nagle's algorithm holds
    # the body back until the server's delayed ACK (what any tuned agent avoids).
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def _post_loop(url: str, path: str, headers: dict, make_body, stop_at: float, on_ok) -> None:
    connection = _http_client(url)
    offset = 0
    while time.monotonic() < stop_at:
        body = make_body(offset)
        try:
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException) as error:
            # A server process cut the connection (MLflow's uvicorn restarts a worker it finds
            # slow): counted, reconnected, the batch sent again.
            DROPPED[path] = DROPPED.get(path, 0) + 1
            print(f"  ! {path}: {error!r}, reconnecting", flush=True)
            connection.close()
            connection = _http_client(url)
            continue
        if response.status not in (200, 202):
            raise RuntimeError(f"{path} answered {response.status}: {answer[:300]!r}")
        on_ok()
        offset += STEPS
    connection.close()


def _in_parallel(clients: int, work) -> float:
    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(work, range(clients)))
    return time.monotonic() - started


def run_brakeline(url: str, jobs: list[tuple[int, str]], seconds: float, acks: list[Acks]) -> None:
    stop_at, base = time.monotonic() + seconds, time.time()

    def client(index: int) -> None:
        headers = {"Authorization": f"Bearer {jobs[index][1]}", "Content-Type": "application/json"}
        _post_loop(
            url,
            "/api/v1/agent/metrics",
            headers,
            lambda offset: brakeline_body(offset, base, f"job{jobs[index][0]}"),
            stop_at,
            lambda: acks[index].add(BATCH),
        )

    _in_parallel(len(jobs), client)


def run_small(url: str, jobs: list[tuple[int, str]], seconds: float, kind: str) -> int:
    """Requests as a big job's ranks send most of them: heartbeats, or the batch one step of
    ten metrics makes (the SDK flushes every second whatever it holds). The count answered."""
    counts = [0] * len(jobs)
    stop_at = time.monotonic() + seconds

    def client(index: int) -> None:
        headers = {"Authorization": f"Bearer {jobs[index][1]}", "Content-Type": "application/json"}

        def body(offset: int) -> bytes:
            step = offset // STEPS
            if kind == "heartbeat":
                return json.dumps({"step": step, "status": "running", "pid": 4242}).encode()
            points = [{"name": name, "step": step, "value": 1.0} for name in NAMES]
            batch = f"small-{jobs[index][0]}-{step}"
            return json.dumps({"batch": batch, "points": points}).encode()

        def done() -> None:
            counts[index] += 1

        path = "/api/v1/agent/heartbeat" if kind == "heartbeat" else "/api/v1/agent/metrics"
        _post_loop(url, path, headers, body, stop_at, done)

    _in_parallel(len(jobs), client)
    return sum(counts)


def run_mlflow(url: str, runs: list[str], seconds: float, offsets: dict[str, int]) -> int:
    counts = [0] * len(runs)
    stop_at, base = time.monotonic() + seconds, time.time()

    def client(index: int) -> None:
        run = runs[index]
        start = offsets.get(run, 0)  # a run's steps keep rising across rounds (rows stay unique)

        def body(offset: int) -> bytes:
            return mlflow_body(run, start + offset, base)

        def done() -> None:
            counts[index] += BATCH

        _post_loop(
            url,
            "/api/2.0/mlflow/runs/log-batch",
            {"Content-Type": "application/json"},
            body,
            stop_at,
            done,
        )
        offsets[run] = start + counts[index] // METRICS

    _in_parallel(len(runs), client)
    return sum(counts)


def block_rows(job_id: int, offset: int, base: float) -> list[tuple]:
    """The same batch as compaction stores it (breakers/storage/compaction.py): one
    ``MetricBlock`` row for the rank, the 10 metrics × 100 steps as one 2-D array."""
    from breakers.storage.blocks import blocks_of

    points = [
        (number, name, step, round(moment.timestamp() * 1e6), value, node, rank)
        for number, (_, name, step, moment, value, node, rank) in enumerate(
            copy_batch(job_id, offset, base), start=1
        )
    ]
    return [block.row(job_id) for block in blocks_of(points)]


def run_copy(connections: list, job_ids: list[int], seconds: float, blocks: bool = False) -> int:
    """COPY of the batches' points: one row each (the table ingest writes today), or with
    ``blocks`` one block row per batch and rank (what ingest writing blocks would store; the
    blocks are built before the clock runs, so this is PostgreSQL's part alone)."""
    from breakers.agent.store import copy_rows
    from breakers.storage.compaction import COPY_BLOCK_TYPES, COPY_BLOCKS_SQL

    counts = [0] * len(job_ids)
    base = time.time()
    ready = range(64) if blocks else range(0)  # batches built ahead, used round in turn
    prepared = {job_id: [block_rows(job_id, n * STEPS, base) for n in ready] for job_id in job_ids}
    stop_at = time.monotonic() + seconds

    def client(index: int) -> None:
        connection, offset, job_id = connections[index], 0, job_ids[index]
        while time.monotonic() < stop_at:
            with connection.transaction(), connection.cursor() as cursor:
                if blocks:
                    with cursor.copy(COPY_BLOCKS_SQL) as copy:
                        copy.set_types(COPY_BLOCK_TYPES)
                        for row in prepared[job_id][(offset // STEPS) % 64]:
                            copy.write_row(row)
                else:
                    copy_rows(cursor, copy_batch(job_id, offset, base))
            counts[index] += BATCH
            offset += STEPS

    _in_parallel(len(job_ids), client)
    return sum(counts)


class LagWatch:
    """Samples, every 50 ms, how far each job's evaluation trails its acknowledged batches."""

    def __init__(self, dsn: str, job_ids: list[int], acks: list[Acks]) -> None:
        self.dsn, self.job_ids, self.acks = dsn, job_ids, acks
        self.samples: list[float] = []
        self.evaluated: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LagWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def read(self, connection) -> dict[int, int]:
        rows = connection.execute(
            "SELECT job_id, points_evaluated FROM breakers_evaluationstate WHERE job_id = ANY(%s)",
            [self.job_ids],
        ).fetchall()
        return {**dict.fromkeys(self.job_ids, 0), **dict(rows)}

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as connection:
            while not self._stop.is_set():
                evaluated, now = self.read(connection), time.monotonic()
                self.evaluated = evaluated
                self.samples.extend(
                    acks.lag(evaluated[job_id], now)
                    for job_id, acks in zip(self.job_ids, self.acks, strict=True)
                )
                self._stop.wait(0.05)

    def caught_up(self) -> bool:
        return all(
            self.evaluated.get(job_id, 0) >= (acks.totals[-1] if acks.totals else 0)
            for job_id, acks in zip(self.job_ids, self.acks, strict=True)
        )


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import psycopg

        self.args = args
        self.dsn = os.environ["DATABASE_URL"]  # set_up_django pointed it at the bench database
        self.database = self.dsn.rsplit("/", 1)[1]
        self.mlflow_database = f"{self.database}_mlflow"
        self.admin = psycopg.connect(self.dsn.rsplit("/", 1)[0] + "/postgres", autocommit=True)
        self.mlflow_offsets: dict[str, int] = {}
        self.copy_job_ids: list[int] = []
        self.copy_connections: list = []
        self.jobs_made = 0

    def clean_up(self) -> None:
        """The bench database is scratch: its points go (millions of rows a run), and
        MLflow's database with them."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as connection:
            connection.execute("TRUNCATE breakers_metricpoint, breakers_metricblock")
        self.admin.execute(f'DROP DATABASE IF EXISTS "{self.mlflow_database}" WITH (FORCE)')

    def new_jobs(self, count: int) -> list[tuple[int, str]]:
        from incidents.jobs import create_job

        made = []
        for _ in range(count):
            self.jobs_made += 1
            created = create_job("bench-ingest", f"ingest-{time.time_ns()}-{self.jobs_made}")
            made.append((created.job.pk, created.raw_token))
        return made

    def _cpu_reading(self, stack, extra_pids: dict[str, int]) -> dict[str, float]:
        reading = dict(stack.cpu())
        reading["client"] = own_cpu()
        reading.update({name: tree_cpu(pid) for name, pid in extra_pids.items()})
        return reading

    def _measured(self, stack, extra_pids: dict[str, int], work) -> tuple[int, float, dict]:
        """Run ``work()`` (returning points) and the CPU every process spent meanwhile."""
        databases = [self.database, self.mlflow_database]
        before = self._cpu_reading(stack, extra_pids)
        pg_before = postgres_cpu(self.admin, databases)
        started = time.monotonic()
        points, after_load = work()
        elapsed = after_load - started
        after = self._cpu_reading(stack, extra_pids)
        cpu = {name: after[name] - before[name] for name in after}
        cpu["postgres"] = postgres_delta(pg_before, postgres_cpu(self.admin, databases))
        per_point = {name: seconds / max(points, 1) * 1e6 for name, seconds in cpu.items()}
        return points, elapsed, per_point

    def small(self, stack, clients: int, kind: str) -> Result:
        """Small requests through one web process: the rate, and the CPU each costs."""
        jobs = self.new_jobs(clients)

        def work() -> tuple[int, float]:
            return run_small(stack.urls[1], jobs, self.args.seconds, kind), time.monotonic()

        requests, elapsed, per_request = self._measured(stack, {}, work)
        self.finish(stack.urls[1], jobs)  # no silence alerts from them in later measurements
        return Result(requests / elapsed, cpu=per_request)

    def brakeline(self, stack, clients: int, web: int = 1) -> Result:
        jobs = self.new_jobs(clients)
        job_ids = [job_id for job_id, _ in jobs]
        outcome: dict = {}

        def work() -> tuple[int, float]:
            acks = [Acks() for _ in jobs]
            with LagWatch(self.dsn, job_ids, acks) as watch:
                run_brakeline(stack.urls[web], jobs, self.args.seconds, acks)
                ended = time.monotonic()
                points = sum(a.totals[-1] if a.totals else 0 for a in acks)
                time.sleep(0.1)
                outcome["behind"] = points - sum(watch.evaluated.values())
                deadline = ended + 300
                while not watch.caught_up() and time.monotonic() < deadline:
                    time.sleep(0.05)
                outcome["drain"] = time.monotonic() - ended
                outcome["caught_up"] = watch.caught_up()
            outcome["lag"] = percentile(watch.samples, 0.95) if watch.samples else 0.0
            return points, ended

        points, elapsed, cpu = self._measured(stack, {}, work)
        if not outcome["caught_up"]:
            print(f"  ! evaluation had not caught up {outcome['drain']:.0f} s after the load")
        self.finish(stack.urls[1], jobs)
        return Result(points / elapsed, outcome["lag"], outcome["behind"], outcome["drain"], cpu)

    def warm_up(self, stack, mlflow_url: str, mlflow_pid: int, runs: list[str]) -> None:
        """A short unmeasured load first: imports, pools and caches of every process filled."""
        seconds, self.args.seconds = self.args.seconds, 2.0
        for web in stack.urls:
            self.brakeline(stack, 2, web)
        if mlflow_url:
            self.mlflow(stack, mlflow_url, mlflow_pid, runs[:2])
        self.copy(stack, 1)
        self.args.seconds = seconds

    def finish(self, url: str, jobs: list[tuple[int, str]]) -> None:
        """End the jobs, so the beat stops ticking them in later measurements."""
        for _, token in jobs:
            connection = _http_client(url)
            body = json.dumps({"step": 0, "status": "finished", "hostname": NODE})
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            connection.request("POST", "/api/v1/agent/heartbeat", body=body, headers=headers)
            connection.getresponse().read()
            connection.close()

    def mlflow(self, stack, url: str, pid: int, runs: list[str]) -> Result:
        def work() -> tuple[int, float]:
            points = run_mlflow(url, runs, self.args.seconds, self.mlflow_offsets)
            return points, time.monotonic()

        points, elapsed, cpu = self._measured(stack, {"mlflow": pid}, work)
        return Result(points / elapsed, cpu=cpu)

    def copy(self, stack, clients: int, blocks: bool = False) -> Result:
        import psycopg

        from breakers.storage import partitions

        partitions.ensure(datetime.now(UTC), datetime.now(UTC))  # the blocks' day

        while len(self.copy_job_ids) < clients:
            self.copy_job_ids.append(self.new_jobs(1)[0][0])  # never evaluated: no task
            # Opened once and kept, as a pool would: their backends are in the CPU readings.
            self.copy_connections.append(psycopg.connect(self.dsn))

        def work() -> tuple[int, float]:
            points = run_copy(
                self.copy_connections, self.copy_job_ids[:clients], self.args.seconds, blocks
            )
            return points, time.monotonic()

        points, elapsed, cpu = self._measured(stack, {}, work)
        return Result(points / elapsed, cpu=cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--clients", default="1,4")
    parser.add_argument("--web", type=int, default=2, help="scale-out: 1 … this many")
    parser.add_argument("--no-mlflow", action="store_true")
    args = parser.parse_args()
    clients = tuple(int(c) for c in args.clients.split(","))
    set_up_django()
    bench = Bench(args)
    mlflow_version = ""
    if not args.no_mlflow:
        try:
            _mlflow.ensure_installed()
            mlflow_version = _mlflow.version()
        except (OSError, subprocess.CalledProcessError) as error:
            # No PyPI here: the rest is still measured, and the table says what is missing.
            print(f"  ! MLflow could not be installed ({error}); measuring without it")
            args.no_mlflow = True
        else:
            _mlflow.recreate_database(bench.admin, bench.mlflow_database)
    env = {"BRAKELINE_AGENT_RATE": "100000000/min"}
    results: dict = {}
    mlflow_url = bench.dsn.rsplit("/", 1)[0] + "/" + bench.mlflow_database
    print(
        f"ingest: batches of {BATCH} points ({METRICS} metrics × {STEPS} steps), "
        f"{args.rounds} interleaved rounds of {args.seconds:g} s, load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    with stack(args.web, env) as running, _maybe_mlflow(args, mlflow_url) as (ml_url, ml_pid):
        runs = _mlflow.create_runs(ml_url, max(clients)) if ml_url else []
        bench.warm_up(running, ml_url, ml_pid, runs)
        for round_number in range(1, args.rounds + 1):
            for count in clients:
                results.setdefault(("brakeline", count), []).append(bench.brakeline(running, count))
                if ml_url:
                    results.setdefault(("mlflow", count), []).append(
                        bench.mlflow(running, ml_url, ml_pid, runs[:count])
                    )
                results.setdefault(("copy", count), []).append(bench.copy(running, count))
                results.setdefault(("blocks", count), []).append(
                    bench.copy(running, count, blocks=True)
                )
            for web in range(1, args.web + 1):
                results.setdefault(("scale", web), []).append(
                    bench.brakeline(running, max(clients), web)
                )
            for kind in ("heartbeat", "batch10"):
                results.setdefault(("small", kind), []).append(
                    bench.small(running, max(clients), kind)
                )
            print(f"  round {round_number} done, load {os.getloadavg()[0]:.1f}", flush=True)
    print_table(results, clients, mlflow_version)
    print_scaling(results, tuple(range(1, args.web + 1)), max(clients))
    print_small(results, max(clients))
    bench.clean_up()


class _maybe_mlflow:
    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.enabled, self.url, self._context = not args.no_mlflow, url, None

    def __enter__(self) -> tuple[str, int]:
        if not self.enabled:
            return "", 0
        self._context = _mlflow.server(self.url)
        return self._context.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)


if __name__ == "__main__":
    main()
