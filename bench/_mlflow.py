"""MLflow's tracking server on PostgreSQL, as the ingest benchmark's yardstick.

Installed from PyPI by the benchmark itself into a venv of its own (``bench/.mlflow-venv``,
kept between runs; ``MLFLOW_VENV`` elsewhere), never into the project's: MLflow pins
versions of its own. Its store is a PostgreSQL database of its own, ``<bench db>_mlflow``,
dropped and created anew each run. The server runs as MLflow starts it by default (its
``mlflow server`` command and default workers); points go through the REST API's
``runs/log-batch`` (at most 1,000 metrics per call, what the benchmark sends).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from _prodstack import spawn
from _stack import free_port

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("MLFLOW_VENV", HERE / ".mlflow-venv"))
REQUIREMENTS = ["mlflow>=3,<4", "psycopg2-binary"]


def ensure_installed() -> Path:
    """The venv's ``mlflow`` command, installing MLflow 3.x first when it is missing."""
    command = VENV / "bin" / "mlflow"
    if not command.exists():
        print(f"installing {' '.join(REQUIREMENTS)} into {VENV} (once) …", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [
                str(VENV / "bin" / "pip"),
                "install",
                "--quiet",
                "--disable-pip-version-check",
                *REQUIREMENTS,
            ],
            check=True,
        )
    return command


def version() -> str:
    python = VENV / "bin" / "python"
    return subprocess.run(
        [str(python), "-c", "import mlflow; print(mlflow.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def recreate_database(admin, name: str) -> None:
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}"')


@contextmanager
def server(database_url: str):
    """``mlflow server`` on ``database_url``; yields its base URL and pid once it answers."""
    command = ensure_installed()
    port = free_port()
    artifacts = Path(os.environ.get("TMPDIR", "/tmp")) / f"mlflow-bench-artifacts-{port}"
    process = spawn(
        [
            str(command),
            "server",
            "--backend-store-uri",
            database_url.replace("postgresql://", "postgresql+psycopg2://"),
            "--default-artifact-root",
            str(artifacts),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            # Its defaults otherwise; uvicorn's supervisor would kill a worker that answers its
            # 5 s health ping late on this loaded machine, cutting requests off mid-answer.
            "--uvicorn-opts",
            "--timeout-worker-healthcheck 60",
        ],
        {"MLFLOW_LOGGING_LEVEL": "WARNING"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # the first start migrates its schema
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {process.returncode}")
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield url, process.pid
    finally:
        from _prodstack import _stop

        _stop(process)


def post(url: str, path: str, body: dict, attempts: int = 5) -> dict:
    for attempt in range(attempts):
        try:
            return _post(url, path, body)
        except (OSError, http.client.HTTPException):
            if attempt == attempts - 1:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


def _post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(
        f"{url}/api/2.0/mlflow/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"{}")


def create_runs(url: str, count: int) -> list[str]:
    experiment = post(url, "experiments/create", {"name": f"ingest-{time.time_ns()}"})
    return [
        post(
            url,
            "runs/create",
            {"experiment_id": experiment["experiment_id"], "start_time": int(time.time() * 1000)},
        )["run"]["info"]["run_id"]
        for _ in range(count)
    ]
