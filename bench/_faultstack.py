"""A whole Brakeline of its own, for the fault suite: every part a process it may kill.

PostgreSQL (a cluster of its own: initdb and pg_ctl into a temporary folder, on a free port),
Redis (its own redis-server on a free port, no persistence), Daphne, Celery workers and beat,
and a fake SMS/phone provider (a real HTTP server on 127.0.0.1 that honours Idempotency-Key).
Nothing here touches the machine's shared PostgreSQL or Redis: other suites run against those.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench._stack import celery_command, daphne_command

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "faults"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(predicate: Any, what: str, timeout: float = 60.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"still waiting for {what} after {timeout:.0f} s")


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def pg_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin")
    return Path(found[-1]).parent


# --- The fake provider --------------------------------------------------------------------


@dataclass
class Provider:
    """SMS, calls and chat webhooks; a request with an Idempotency-Key seen before is
    answered as the first was and pages nobody again (as a provider honouring it does)."""

    url: str = ""
    requests: list[tuple[float, str, str]] = field(default_factory=list)  # (at, path, key)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hold: threading.Event | None = None  # set: requests wait until released (a slow provider)
    arrived: threading.Event = field(default_factory=threading.Event)

    def pages(self) -> dict[str, int]:
        """Requests per idempotency key."""
        counts: dict[str, int] = {}
        with self.lock:
            for _, _, key in self.requests:
                counts[key] = counts.get(key, 0) + 1
        return counts


def start_provider() -> tuple[Provider, ThreadingHTTPServer]:
    state = Provider()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            key = self.headers.get("Idempotency-Key") or f"unkeyed-{time.monotonic()}"
            with state.lock:
                state.requests.append((time.monotonic(), self.path, key))
            state.arrived.set()
            if state.hold is not None:
                state.hold.wait(60)
            body = b'{"sid": "SM1", "status": "queued"}'
            try:
                self.send_response(201 if self.path.endswith(".json") else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the worker that asked was killed

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return state, server


# --- The stack ------------------------------------------------------------------------------


class Stack:
    """Start, kill and restart each part; ``env`` is what every console process gets."""

    def __init__(self, workers: int = 2, extra_env: dict[str, str] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="brakeline-faults-"))
        os.chmod(self.dir, 0o755)
        self.pg_port, self.redis_port, self.web_port = free_port(), free_port(), free_port()
        self.provider, self._provider_server = start_provider()
        self.worker_names = [f"w{n}" for n in range(workers)]
        # Two beats, as production runs them: one sends while it holds the lease.
        self.beat_names = ["beat-a", "beat-b"]
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("PYTEST", "DJANGO", "BRAKELINE_", "DATABASE_URL", "REDIS_URL"))
        }
        self.env.update(
            DATABASE_URL=f"postgresql://postgres@127.0.0.1:{self.pg_port}/brakeline",
            REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0",
            BRAKELINE_CHANNEL_PREFIX=QUEUE,
            BRAKELINE_CELERY_QUEUE=QUEUE,
            BRAKELINE_SECRET_KEY="brakeline-fault-suite-only-secret-key-not-for-deployment",
            BRAKELINE_NOTIFY_ALLOW_PRIVATE_URLS="true",
            BRAKELINE_NOTIFY_PROVIDER_URL=self.provider.url + "/2010-04-01/Accounts/AC1",
            BRAKELINE_NOTIFY_PROVIDER_SID="AC1",
            BRAKELINE_NOTIFY_PROVIDER_TOKEN="secret",
            BRAKELINE_NOTIFY_FROM_NUMBER="+15550000000",
            BRAKELINE_NOTIFY_HTTP_TIMEOUT_SECONDS="2",
            BRAKELINE_NOTIFY_LEASE_SECONDS="6",
            BRAKELINE_TICK_SECONDS="1",
            BRAKELINE_AGENT_RATE="100000/min",
            PYTHONUNBUFFERED="1",
            **(extra_env or {}),
        )
        self.url = f"http://127.0.0.1:{self.web_port}"

    # -- PostgreSQL --------------------------------------------------------------------------
    def _as_postgres(self, *command: str) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)

    def init_postgres(self) -> None:
        data = self.dir / "pg"
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        subprocess.run(
            self._as_postgres(
                str(pg_bin() / "initdb"),
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        self.start_postgres()
        subprocess.run(
            [
                "psql",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.pg_port),
                "-U",
                "postgres",
                "-qc",
                "CREATE DATABASE brakeline",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def _pg_ctl(self, *arguments: str) -> None:
        options = f"-p {self.pg_port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            self._as_postgres(
                str(pg_bin() / "pg_ctl"),
                "-D",
                str(self.dir / "pg"),
                "-o",
                options,
                "-l",
                str(self.dir / "pg.log"),
                "-w",
                *arguments,
            ),
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def start_postgres(self) -> None:
        self._pg_ctl("start")

    def stop_postgres(self) -> None:
        self._pg_ctl("stop", "-m", "fast")

    def sql(self, query: str, parameters: tuple = ()) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.env["DATABASE_URL"], connect_timeout=10) as connection:
            return connection.execute(query, parameters).fetchall()  # type: ignore[arg-type]

    # -- Redis -------------------------------------------------------------------------------
    def start_redis(self) -> None:
        port = str(self.redis_port)
        command = ["redis-server", "--bind", "127.0.0.1", "--port", port, "--save", ""]
        self._start("redis", [*command, "--appendonly", "no"])
        wait_until(lambda: port_open(self.redis_port), "Redis to listen")

    def shutdown_redis(self) -> None:
        """``redis-cli shutdown nosave``: everything in it (queues, flags, liveness) is gone."""
        subprocess.run(
            ["redis-cli", "-p", str(self.redis_port), "shutdown", "nosave"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.processes.pop("redis").wait(30)

    def watchdog_last_run(self) -> float | None:
        """When the watchdog last ran (epoch seconds; its liveness record in Redis)."""
        said = subprocess.run(
            ["redis-cli", "-p", str(self.redis_port), "get", f"{QUEUE}:liveness:beat"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        try:
            return float(said)
        except ValueError:
            return None

    # -- The console's processes -------------------------------------------------------------
    def _start(self, name: str, command: list[str]) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "a")  # noqa: SIM115 - the child holds it
        process = subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=log, stderr=log)
        log.close()
        self.processes[name] = process
        return process

    def manage(self, *arguments: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *arguments],
            cwd=ROOT,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode:
            raise RuntimeError(f"manage.py {arguments[0]} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def start_daphne(self) -> None:
        self._start(
            "daphne",
            daphne_command(self.web_port),
        )
        wait_until(lambda: port_open(self.web_port), "Daphne to listen")

    def start_worker(self, name: str) -> None:
        self._start(
            name,
            celery_command(
                "worker",
                "--pool",
                "solo",
                "--loglevel",
                "WARNING",
                "--hostname",
                f"{name}@faults",
                "--without-gossip",
                "--without-mingle",
            ),
        )

    def start_beat(self, name: str) -> None:
        self._start(
            name,
            celery_command(
                "beat", "--loglevel", "WARNING", "--schedule", str(self.dir / f"{name}-schedule")
            ),
        )

    def leading_beat(self) -> str | None:
        """The running beat that holds the lease (config/beat.py logs each change, with its
        pid), or None while none has taken it."""
        for name in self.beat_names:
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                continue
            said = re.findall(
                rf"\(pid {process.pid}\): (took|lost) the lease",
                (self.dir / f"{name}.log").read_text(errors="replace"),
            )
            if said and said[-1] == "took":
                return name
        return None

    def hold(self, names: list[str], sig: int = signal.SIGSTOP) -> None:
        """SIGSTOP (or, with SIGCONT, release) processes in place: a held worker takes no task,
        so what is queued stays owed until the fault strikes."""
        for name in names:
            self.processes[name].send_signal(sig)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        process = self.processes.pop(name)
        process.send_signal(sig)
        process.wait(60)

    def start_console(self) -> None:
        self.start_daphne()
        for name in self.worker_names:
            self.start_worker(name)
        for name in self.beat_names:
            self.start_beat(name)

    def kill_console(self) -> None:
        for name in ["daphne", *self.beat_names, *self.worker_names]:
            if name in self.processes:
                self.kill(name)

    def start(self) -> None:
        self.init_postgres()
        self.start_redis()
        self.manage("migrate", "--verbosity", "0")
        self.start_console()
        try:
            wait_until(lambda: self.health()[0] == 200, "the console to be healthy", timeout=120)
        except TimeoutError as error:
            # Seen once in CI with nothing else said: which part the console found down, and
            # what its processes logged, are what the next occurrence needs.
            raise TimeoutError(f"{error}; /api/v1/health: {self.health()}\n{self.logs()}") from None

    def close(self) -> None:
        for name in list(self.processes):
            if name != "redis":
                self.kill(name)
        if "redis" in self.processes:
            self.shutdown_redis()
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop_postgres()
        self._provider_server.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)

    def dump_stacks(self) -> None:
        """Each Celery worker logs the traceback of every thread (the worker's SIGUSR1
        handler): what a worker that stopped consuming is waiting on. Not the beat: it installs
        no such handler, and SIGUSR1's default action killed it, so every fault after the
        first failing one ran without a beat and failed too (seen in CI)."""
        for name in self.worker_names:
            process = self.processes.get(name)
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGUSR1)
        time.sleep(2)

    def logs(self, tail: int = 6000) -> str:
        exited = [
            f"{name} exited with {process.returncode}"
            for name, process in self.processes.items()
            if process.poll() is not None
        ]
        return "\n".join(
            [*exited]
            + [
                f"--- {path.name}\n{path.read_text(errors='replace')[-tail:]}"
                for path in sorted(self.dir.glob("*.log"))
            ]
        )

    # -- Reading its state -------------------------------------------------------------------
    def health(self) -> tuple[int, dict]:
        """(status, body) of /api/v1/health; (0, {}) when nothing answers."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/health", timeout=5) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            try:
                return error.code, json.loads(error.read())
            except ValueError:
                return error.code, {}
        except (OSError, ValueError):
            return 0, {}
