"""Starting ``train_ranks.py`` under real torchrun (gloo on CPU) for the whole-job tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.brakeline.live import SCRIPTS, training_environment
from tests.conftest import ROOT


@dataclass
class Torchrun:
    process: subprocess.Popen
    work: Path
    log: Path

    def losses(self, rank: int, suffix: str = "") -> list[tuple[int, str]]:
        path = self.work / f"losses-rank{rank}{suffix}.txt"
        lines = path.read_text().split("\n") if path.exists() else []
        return [(int(a), b) for a, b in (line.split() for line in lines if line)]

    def starts(self) -> list[list[str]]:
        path = self.work / "starts.txt"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"torchrun still running:\n{self.tail()}") from None

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def torchrun(
    work: Path,
    *args: str,
    ranks: int = 2,
    console: str | None = None,
    token: str | None = None,
    max_restarts: int = 0,
    log_name: str = "torchrun.log",
) -> Torchrun:
    """torchrun --standalone in a session of its own (so it leads its process group, as from
    a shell), the SDK talking to ``console`` when given."""
    work.mkdir(parents=True, exist_ok=True)
    env = training_environment(console, token) | {"BRAKELINE_WEBSOCKET": "0"}
    log = work / log_name
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(ranks),
        "--max-restarts",
        str(max_restarts),
        "--monitor-interval",
        "0.2",
        str(SCRIPTS / "train_ranks.py"),
        str(work),
        *args,
    ]
    with log.open("w") as output:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Torchrun(process, work, log)
