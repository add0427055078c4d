"""`manage.py demo` as a newcomer runs it (embedded: SQLite, in-process worker, subprocesses).

The demo's job is a real PyTorch run with the SDK (console/demo_training.py) that diverges on
purpose: the console must brake it with a checkpoint the run really wrote. Without torch the
demo says so and plays the simulated run instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.embedded


class Demo:
    """``manage.py demo`` in a subprocess, its output in a file (a pipe nobody reads while the
    test polls the database would fill up and block the demo)."""

    def __init__(self, tmp_path: Path, *args: str, pythonpath: str = "") -> None:
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
        env.pop("BRAKELINE_SECRET_KEY", None)
        env["BRAKELINE_DATA_DIR"] = str(tmp_path)
        if pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([pythonpath, str(ROOT)])
        self.port = free_port()
        self.log = tmp_path / "demo.log"
        command = [sys.executable, "manage.py", "demo", "--port", str(self.port), *args]
        with open(self.log, "w") as output:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT
            )

    def stop(self) -> str:
        """Ctrl-C, as a person would; returns what the demo printed."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=60)
        return self.log.read_text()

    def leftovers(self) -> str:
        """Processes it started that are still running (its Daphne, its training run)."""
        pattern = f"daphne -b [^ ]+ -p {self.port} |{self.log.parent}"
        found = subprocess.run(["pgrep", "-af", "--", pattern], capture_output=True, text=True)
        assert found.returncode in (0, 1), found.stderr  # 1: nothing found
        return found.stdout


def query(tmp_path: Path, sql: str) -> list[tuple]:
    database = tmp_path / "brakeline.sqlite3"
    if not database.exists():
        return []
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5) as connection:
        try:
            return connection.execute(sql).fetchall()
        except sqlite3.OperationalError:  # not migrated yet, or busy
            return []


def run_until_braked(tmp_path: Path, braked_before: int) -> tuple[list[tuple], str]:
    """One ``make demo`` in ``tmp_path`` until its run is braked, then Ctrl-C."""
    demo = Demo(tmp_path, "--diverge-at", "40", "--seconds", "120")
    try:
        deadline = time.monotonic() + 120
        braked: list[tuple] = []
        while len(braked) <= braked_before and time.monotonic() < deadline:
            if demo.process.poll() is not None:
                break
            time.sleep(0.5)
            braked = query(
                tmp_path,
                "SELECT c.result, c.reason, c.severity, j.name FROM breakers_command c "
                "JOIN incidents_job j ON j.id = c.job_id "
                "WHERE c.kind = 'checkpoint_and_pause' AND c.status = 'succeeded' ORDER BY c.id",
            )
    finally:
        output = demo.stop()
    assert demo.leftovers() == ""
    return braked, output


def check_braked(row: tuple, job_name: str) -> None:
    result, reason, severity, name = row
    result = json.loads(result)
    assert name == job_name
    assert severity == "L3" and "NaN/Inf" in reason
    assert hashlib.sha256(Path(result["path"]).read_bytes()).hexdigest() == result["sha256"]
    assert result["step"] > 40  # it trained healthily first, then diverged


def test_the_demo_trains_for_real_diverges_and_is_braked_and_runs_again(tmp_path):
    """Twice in one data directory, as `make demo`, Ctrl-C, `make demo` again."""
    pytest.importorskip("torch")
    braked, output = run_until_braked(tmp_path, braked_before=0)
    assert len(braked) == 1, output
    assert "A real PyTorch training run" in output
    check_braked(braked[0], "demo-run")
    # Ctrl-C stopped its training process: the run is over, not silent (a console started
    # later on this data would otherwise raise a heartbeat alert for it, and page for it).
    assert query(tmp_path, "SELECT status FROM incidents_job") == [("terminated",)]

    braked, output = run_until_braked(tmp_path, braked_before=1)
    assert len(braked) == 2, output
    check_braked(braked[1], "demo-run-2")
    # The earlier run and its incident are kept, its run over (terminated, its alerts and
    # incident resolved, a row saying why); only the new job can still report.
    assert query(tmp_path, "SELECT name, status FROM incidents_job ORDER BY id") == [
        ("demo-run", "terminated"),
        ("demo-run-2", "terminated"),
    ]
    incidents = query(
        tmp_path,
        "SELECT j.name, i.status FROM incidents_incident i JOIN incidents_job j ON j.id = i.job_id "
        "ORDER BY i.id",
    )
    assert len(incidents) == 2 and incidents[0] == ("demo-run", "resolved"), incidents
    assert query(
        tmp_path,
        "SELECT COUNT(*) FROM incidents_alert a JOIN incidents_job j ON j.id = a.job_id "
        "WHERE j.name = 'demo-run' AND a.status != 'resolved'",
    ) == [(0,)]
    assert query(
        tmp_path,
        "SELECT COUNT(*) FROM incidents_timelineentry t JOIN incidents_incident i "
        "ON i.id = t.incident_id JOIN incidents_job j ON j.id = i.job_id "
        "WHERE j.name = 'demo-run' AND t.kind = 'terminated' "
        "AND t.message LIKE '%demo was stopped%'",
    ) == [(1,)]
    assert query(
        tmp_path,
        "SELECT COUNT(*) FROM incidents_agenttoken t JOIN incidents_job j ON j.id = t.job_id "
        "WHERE j.name = 'demo-run' AND t.revoked_at IS NULL",
    ) == [(0,)]


def test_without_torch_the_demo_says_so_and_simulates(tmp_path):
    blocker = tmp_path / "no-torch"
    blocker.mkdir()
    # A child interpreter in which torch cannot be found, as if it were not installed.
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, NoTorch())\n"
    )
    demo = Demo(tmp_path, "--seconds", "4", pythonpath=str(blocker))
    demo.process.wait(timeout=180)  # --seconds ends it by itself (a loaded machine: slowly)
    output = demo.stop()
    assert "install torch for the real training run; falling back to the simulator" in output
    assert "A simulated training run" in output
    points = query(tmp_path, "SELECT COUNT(*) FROM breakers_metricpoint")
    assert points and points[0][0] > 0
    assert demo.leftovers() == ""


def test_closing_the_terminal_stops_the_training_run_too(tmp_path):
    """SIGHUP (the terminal closed) ends the demo like Ctrl-C: its training process, in a
    session of its own that the hang-up never reaches, is stopped, not left posting with a
    token the next demo revokes."""
    pytest.importorskip("torch")
    demo = Demo(tmp_path, "--seconds", "300")
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and demo.process.poll() is None:
            points = query(tmp_path, "SELECT COUNT(*) FROM breakers_metricpoint")
            if points and points[0][0] > 0:
                break  # the training process runs and reports
            time.sleep(0.5)
        assert demo.process.poll() is None, demo.log.read_text()
        demo.process.send_signal(signal.SIGHUP)
        demo.process.wait(timeout=120)
    finally:
        demo.stop()
    assert demo.leftovers() == ""
