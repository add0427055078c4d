"""The production process shape for benchmarks, and the CPU each of its processes spends.

What docker-compose.yml runs: N Daphne processes (``--verbosity 0``) behind HAProxy (the
compose stack's balancer, deploy/haproxy.cfg), a Celery worker with the default prefork pool
(``celery -A config worker``, one child per core) and Celery beat. Nothing is stopped while a
benchmark measures: evaluation, the watchdog and the ticks run as they would in production.

CPU accounting reads /proc (utime + stime of a process and its children), so a benchmark can
say which process is the bottleneck: the web processes, the worker, PostgreSQL (the backends
serving the benchmark's databases, found in pg_stat_activity) or the client itself.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

try:
    from _stack import ROOT, free_port
except ImportError:  # imported as bench._prodstack, from the test suite
    from bench._stack import ROOT, free_port

TICKS = os.sysconf("SC_CLK_TCK")
HAPROXY = "/usr/sbin/haproxy"


def _wait_for_port(port: int, process: subprocess.Popen, what: str, seconds: float = 60) -> None:
    import socket

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {seconds:.0f} s")


def _wait_for_page(url: str, seconds: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        # The main process only: a Celery worker then stops its pool children itself (warm
        # shutdown) instead of seeing them die under a running task.
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def spawn(
    command: list[str], env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen:
    """A subprocess in its own process group (stopped with its children), quiet on stdout;
    its stderr goes to ``log`` when given (the request log of the web processes)."""
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=dict(os.environ, **(env or {})),
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab") if log else None,
        start_new_session=True,
    )


def haproxy_config(frontends: dict[int, list[int]]) -> str:
    """deploy/haproxy.cfg's global and defaults sections (the compose stack's balancer) with
    one frontend per ``{port: [backend ports]}`` entry, for local processes: the compose file
    finds its replicas through Docker's DNS, the benchmark knows their ports."""
    template = (ROOT / "deploy" / "haproxy.cfg").read_text()
    common = template.split("\nresolvers ", 1)[0]
    backend = template.split("\nbackend web\n", 1)[1]
    checks = "\n".join(
        line for line in backend.splitlines() if line.strip() and "server-template" not in line
    )
    sections = [common]
    for port, backends in frontends.items():
        servers = "\n".join(
            f"    server web{index} 127.0.0.1:{backend} check"
            for index, backend in enumerate(backends, 1)
        )
        sections.append(
            f"frontend f{port}\n    bind 127.0.0.1:{port}\n    default_backend b{port}\n\n"
            f"backend b{port}\n{checks}\n{servers}\n"
        )
    return "\n".join(sections)


class Stack:
    """``web`` Daphne processes, a prefork worker and beat, and HAProxy in front: ``urls[n]``
    balances over the first n web processes (so 1 → n is measured without a restart, the
    idle ones costing nothing)."""

    def __init__(
        self, web: int, env: dict[str, str], workers: int = 1, concurrency: int | None = None
    ) -> None:
        self.web_count, self.env = web, env
        # Worker processes, each a prefork pool of ``concurrency`` children (None: one per core).
        self.worker_count, self.concurrency = workers, concurrency
        self.web: list[subprocess.Popen] = []
        self.others: dict[str, subprocess.Popen] = {}
        self.urls: dict[int, str] = {}
        self._dir = tempfile.mkdtemp(prefix="brakeline-bench-")

    def start(self) -> Stack:
        ports = [free_port() for _ in range(self.web_count)]
        for port in ports:
            daphne = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "--verbosity", "0"]
            command = [sys.executable, *daphne, "config.asgi:application"]
            self.web.append(spawn(command, self.env, Path(self._dir) / f"web-{port}.log"))
        self._start_celery()
        for port, process in zip(ports, self.web, strict=True):
            _wait_for_port(port, process, "daphne")
        if not os.path.exists(HAPROXY) and self.web_count == 1:
            # A machine without HAProxy still measures one web process, addressed directly.
            print(f"  (no {HAPROXY}: the one Daphne is addressed directly, no balancer)")
            self.urls[1] = f"http://127.0.0.1:{ports[0]}"
            _wait_for_page(f"{self.urls[1]}/login/")
            return self
        self._start_balancer(ports)
        return self

    def _start_celery(self) -> None:
        """Prefork workers on the three queues, and the beat."""
        queue = os.environ.get("BRAKELINE_CELERY_QUEUE", "brakeline")
        celery = [sys.executable, "-m", "celery", "-A", "config"]
        queues = f"{queue}-watchdog,{queue},{queue}-ticks"
        worker = [*celery, "worker", "--loglevel", "WARNING", "--queues", queues]
        if self.concurrency:
            worker += ["--concurrency", str(self.concurrency)]
        for index in range(self.worker_count):
            # Each worker its own node name: two of one name on a host confuse Celery's control.
            named = [*worker, "--hostname", f"bench{index}@%h"] if index else worker
            self.others["worker" if not index else f"worker-{index}"] = spawn(named, self.env)
        schedule = str(Path(self._dir) / "beat-schedule")
        self.others["beat"] = spawn(
            [*celery, "beat", "--loglevel", "WARNING", "--schedule", schedule], self.env
        )

    def _start_balancer(self, ports: list[int]) -> None:
        """HAProxy, one frontend per count of web processes. Only once they listen: its
        health checks would otherwise mark them down, and up again only after two checks."""
        frontends = {free_port(): ports[:count] for count in range(1, self.web_count + 1)}
        config = Path(self._dir) / "haproxy.cfg"
        config.write_text(haproxy_config(frontends))
        self.others["haproxy"] = spawn(
            [HAPROXY, "-f", str(config), "-db"], log=Path(self._dir) / "haproxy.log"
        )
        for count, port in enumerate(frontends, 1):
            _wait_for_port(port, self.others["haproxy"], "haproxy")
            self.urls[count] = f"http://127.0.0.1:{port}"
            _wait_for_page(f"{self.urls[count]}/login/")

    def stop(self) -> None:
        processes = [*self.web, *self.others.values()]
        for process in processes:  # all asked at once: each may take seconds to finish
            if process.poll() is None:
                process.terminate()
        for process in processes:
            _stop(process)

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the web processes (together), the workers with their pools,
        beat and HAProxy."""
        workers = [p for name, p in self.others.items() if name.startswith("worker")]
        return {
            "web": sum(tree_cpu(p.pid) for p in self.web),
            "worker": sum(tree_cpu(p.pid) for p in workers),
            "beat": tree_cpu(self.others["beat"].pid),
            "haproxy": tree_cpu(self.others["haproxy"].pid) if "haproxy" in self.others else 0.0,
        }

    def web_cpu(self) -> list[float]:
        return [tree_cpu(p.pid) for p in self.web]


@contextmanager
def stack(
    web: int, env: dict[str, str], workers: int = 1, concurrency: int | None = None
) -> Iterator[Stack]:
    running = Stack(web, env, workers, concurrency)
    try:
        yield running.start()
    finally:
        running.stop()


@contextmanager
def private_redis() -> Iterator[tuple[str, subprocess.Popen]]:
    """A Redis server of the benchmark's own (no persistence), so its CPU is the console's
    alone: the machine's shared Redis also serves other work. Yields its URL and process."""
    port = free_port()
    command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    process = spawn([*command, "--appendonly", "no", "--maxclients", "20000"])
    try:
        _wait_for_port(port, process, "redis-server")
        yield f"redis://127.0.0.1:{port}/0", process
    finally:
        _stop(process)


def process_cpu(pid: int) -> float:
    """utime + stime of one process, in seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with suppress(OSError, IndexError):
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                tree.setdefault(parent, []).append(int(entry))
    return tree


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its living descendants (a prefork pool's children)."""
    tree, total, todo = _children(), 0.0, [pid]
    while todo:
        current = todo.pop()
        total += process_cpu(current)
        todo.extend(tree.get(current, []))
    return total


def own_cpu() -> float:
    """This process's CPU seconds (the benchmark's clients run in it, as threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def postgres_cpu(connection, databases: list[str]) -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend now serving one of ``databases``."""
    rows = connection.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s)", [databases]
    ).fetchall()
    return {pid: process_cpu(pid) for (pid,) in rows}


def postgres_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU spent between two readings by backends alive at the second (new ones count whole)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())
