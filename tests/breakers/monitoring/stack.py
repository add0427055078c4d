"""The monitoring stack the end-to-end test runs: a fixture DCGM exporter (a real HTTP server on
127.0.0.1), Debian's Prometheus and Alertmanager started on free ports with temporary data
folders, configured from the files users drop in (deploy/monitoring/) with short intervals."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from tests.conftest import ROOT, free_port, wait_for_port
from tests.support.waiting import wait_for

DEPLOY = ROOT / "deploy" / "monitoring"
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
GPUS = 8


class DcgmExporter:
    """dcgm-exporter's names and labels for several nodes, values set by the test."""

    def __init__(self, nodes: tuple[str, ...]):
        self.lock = threading.Lock()
        self.xid = {(node, gpu): 0 for node in nodes for gpu in range(GPUS)}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def set_xid(self, node: str, value: int) -> None:
        with self.lock:
            for gpu in range(GPUS):
                self.xid[(node, gpu)] = value

    def text(self) -> str:
        lines = [
            "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
            "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
        ]
        with self.lock:
            values = dict(self.xid)
        for (node, gpu), value in sorted(values.items()):
            labels = (
                f'gpu="{gpu}",UUID="GPU-{node}-{gpu}",device="nvidia{gpu}",'
                f'modelName="NVIDIA H100 80GB HBM3",Hostname="{node}"'
            )
            lines.append(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {value}")
        lines += ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
        lines += [f'DCGM_FI_DEV_GPU_TEMP{{gpu="{g}",Hostname="{n}"}} 61' for n, g in values]
        lines += ["# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter"]
        lines += [f'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{gpu="{g}",Hostname="{n}"}} 0' for n, g in values]
        return "\n".join(lines) + "\n"

    def _handler(self):
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        return Handler

    def __enter__(self) -> DcgmExporter:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen
    port: int
    log: Path
    extra: dict = field(default_factory=dict)

    def tail(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- {self.name} log ---\n" + "\n".join(text.splitlines()[-30:])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _start(name: str, argv: list[str], port: int, folder: Path) -> Daemon:
    log = folder / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=folder)
    daemon = Daemon(name, process, port, log)
    try:
        wait_for_port(port, process)
    except RuntimeError as error:
        raise RuntimeError(f"{name} did not start: {error}\n{daemon.tail()}") from None
    return daemon


def start_alertmanager(folder: Path, webhook_url: str, token: str) -> Daemon:
    """The shipped receiver snippet, pointed at the test's console, with one-second timings."""
    config = yaml.safe_load((DEPLOY / "alertmanager-receiver.yml").read_text())
    (route,) = config["route"]["routes"]
    route.update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    webhook = next(r for r in config["receivers"] if r["name"] == "brakeline")["webhook_configs"][0]
    webhook["url"] = webhook_url
    (folder / "integration-token").write_text(token)
    webhook["http_config"]["authorization"]["credentials_file"] = str(folder / "integration-token")
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        str(ALERTMANAGER),
        f"--config.file={folder / 'alertmanager.yml'}",
        f"--storage.path={folder / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # no gossip port: one Alertmanager, nothing else bound
    ]
    return _start("alertmanager", argv, port, folder)


def start_prometheus(
    folder: Path,
    *,
    exporter_port: int,
    console: str,
    metrics_token: str | None,
    alertmanager_port: int,
) -> Daemon:
    """The shipped scrape config and rule files, on 127.0.0.1, scraping every second (not
    Brakeline's /metrics when ``metrics_token`` is None)."""
    config = yaml.safe_load((DEPLOY / "scrape-config.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(DEPLOY / "dcgm-rules.yml"), str(DEPLOY / "brakeline-rules.yml")]
    config["alerting"] = {
        "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]
    }
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    if metrics_token is None:
        config["scrape_configs"].remove(jobs.pop("brakeline"))
        metrics_token = ""
    brakeline = jobs.get("brakeline", {"authorization": {}})
    brakeline["scheme"] = "http"
    brakeline["static_configs"] = [{"targets": [urllib.parse.urlsplit(console).netloc]}]
    (folder / "metrics-token").write_text(metrics_token)
    brakeline["authorization"]["credentials_file"] = str(folder / "metrics-token")
    jobs["dcgm"]["static_configs"] = [{"targets": [f"127.0.0.1:{exporter_port}"]}]
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    argv = [
        str(PROMETHEUS),
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return _start("prometheus", argv, port, folder)


def query(prometheus: Daemon, expression: str) -> list[dict]:
    """An instant query; [] while Prometheus cannot answer yet."""
    url = f"http://127.0.0.1:{prometheus.port}/api/v1/query?" + urllib.parse.urlencode(
        {"query": expression}
    )
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())["data"]["result"]
    except OSError:
        return []


@dataclass
class Stack:
    exporter: DcgmExporter
    prometheus: Daemon
    alertmanager: Daemon

    def logs(self) -> str:
        return self.prometheus.tail() + "\n" + self.alertmanager.tail()

    def query(self, expression: str) -> list[dict]:
        return query(self.prometheus, expression)


@contextmanager
def monitoring_stack(
    folder: Path, *, nodes: tuple[str, ...], console: str, token: str, metrics_token: str | None
) -> Iterator[Stack]:
    """Exporter, Alertmanager (→ ``console``'s receiver with ``token``) and Prometheus, up
    and scraping the exporter; stopped by their own PIDs at the end."""
    with DcgmExporter(nodes) as exporter:
        alertmanager = start_alertmanager(
            folder, f"{console}/api/v1/integrations/alertmanager", token
        )
        try:
            prometheus = start_prometheus(
                folder,
                exporter_port=exporter.port,
                console=console,
                metrics_token=metrics_token,
                alertmanager_port=alertmanager.port,
            )
            try:
                stack = Stack(exporter, prometheus, alertmanager)
                wait_for(
                    lambda: stack.query('up{job="dcgm"} == 1'),
                    "Prometheus scraping the DCGM exporter",
                    context=stack.logs,
                )
                yield stack
            finally:
                prometheus.stop()
        finally:
            alertmanager.stop()


def brake_time(stack: Stack, job, node: str):
    """Put XID 79 on every GPU of ``node``; wait for the job's isolate_node. Returns it, the
    seconds from the change to its issue (its issued_at) and to the test seeing it."""
    changed_at, started = datetime.now(UTC), time.monotonic()
    stack.exporter.set_xid(node, 79)
    from breakers.models import Command

    isolate = wait_for(
        lambda: Command.objects.filter(job=job, kind="isolate_node").first(),
        f"isolate_node for the job on {node}",
        context=stack.logs,
    )
    seen = time.monotonic() - started
    issued = (isolate.issued_at - changed_at).total_seconds()
    print(f"\nexporter change → brake: {issued:.2f} s (issued_at), {seen:.2f} s (seen by the test)")
    return isolate, issued, seen
