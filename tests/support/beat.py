"""A real Celery beat on the test database (the watchdog every second), as a subprocess."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def running_beat() -> Iterator[subprocess.Popen]:
    from tests.conftest import ROOT, server_environment

    with tempfile.TemporaryDirectory() as folder:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "--quiet",
                "beat",
                "--loglevel",
                "warning",
                "--schedule",
                str(Path(folder) / "schedule"),
            ],
            cwd=ROOT,
            env=server_environment(),
        )
        try:
            yield process
        finally:
            process.terminate()
            process.wait(timeout=10)
