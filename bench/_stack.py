"""Shared set-up for benchmarks: a scratch PostgreSQL database, Django, and Daphne.

Benchmarks run against the same services as the tests (DATABASE_URL / REDIS_URL, as `make
bench` sets them) but in a database of their own, ``<name>_bench``, created and migrated here.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def daphne_command(port: int) -> list[str]:
    """The console's web process on 127.0.0.1:``port``, without an access log."""
    return [
        sys.executable,
        "-m",
        "daphne",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "--access-log",
        os.devnull,
        "config.asgi:application",
    ]


def celery_command(*arguments: str) -> list[str]:
    """A Celery program of the console's app (``worker``, ``beat``, … and its options)."""
    return [sys.executable, "-m", "celery", "-A", "config", *arguments]


def bench_database_url() -> str:
    base = os.environ.get("DATABASE_URL")
    if not base or not base.startswith(("postgres://", "postgresql://")):
        sys.exit(
            "Benchmarks need DATABASE_URL and REDIS_URL (PostgreSQL, Redis): run `make bench`."
        )
    return base.rsplit("/", 1)[0] + "/" + base.rsplit("/", 1)[1] + "_bench"


def set_up_django() -> None:
    """Point Django at the bench database (created if missing) and migrate it."""
    import psycopg

    url = bench_database_url()
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("BRAKELINE_SECRET_KEY", "bench-only-secret-key-never-for-a-deployment")
    # The stack's beat must not start the hourly drill sets (nine PyTorch processes) mid-run:
    # seen at minute 17, skewing an ingest run. Every process of the bench inherits this.
    os.environ.setdefault("BRAKELINE_DRILL_SCHEDULE", "false")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def daphne(extra_env: dict[str, str] | None = None):
    """Daphne serving the console; yields its URL."""
    with daphne_server(extra_env) as (url, _pid):
        yield url


@contextmanager
def daphne_server(extra_env: dict[str, str] | None = None):
    """Daphne serving the console; yields its URL and its process id (for its CPU)."""
    port = free_port()
    env = dict(os.environ, **(extra_env or {}))
    process = subprocess.Popen(
        daphne_command(port),
        cwd=ROOT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        process.wait(timeout=10)


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def start_worker(*extra: str) -> subprocess.Popen:
    """A real Celery worker subprocess on this run's queue (BRAKELINE_CELERY_QUEUE)."""
    queue = os.environ["BRAKELINE_CELERY_QUEUE"]
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "--quiet",
        "worker",
        "--pool",
        "solo",
        "-Q",
        f"{queue}-watchdog,{queue},{queue}-ticks",
        "--loglevel",
        "warning",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        *extra,
    ]
    return subprocess.Popen(command, cwd=ROOT, env=dict(os.environ))


def start_beat(schedule_file: str) -> subprocess.Popen:
    """Celery beat subprocess (the watchdog every second)."""
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "console",
        "--quiet",
        "beat",
        "--loglevel",
        "warning",
        "--schedule",
        schedule_file,
    ]
    return subprocess.Popen(command, cwd=ROOT, env=dict(os.environ))
