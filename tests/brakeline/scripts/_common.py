"""What the training scripts of the integration tests share: arguments, the losses file, the run.

Each script is a real training process, started by a test as a subprocess: it reads
BRAKELINE_URL / BRAKELINE_TOKEN from its environment like any user's job (offline without
them), and appends ``<step> <float.hex(loss)>`` to --losses after every step, so a test can
compare two runs bit for bit and watch progress while the script runs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import brakeline


def arguments(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--job", default="integration")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--nan-at", type=int, default=0, help="inject a NaN loss at this step")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--losses", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep after each step")
    parser.add_argument("--resume-from", type=Path, default=None)
    parser.add_argument("--expected-sha256", default=None)
    parser.add_argument("--extra-metrics", type=int, default=0)
    parser.add_argument("--backoff-cap", type=float, default=1.0)
    parser.add_argument("--max-memory-points", type=int, default=50_000)
    parser.add_argument("--stop-file", type=Path, default=None, help="stop once it exists")
    return parser.parse_args()


def start_run(options: argparse.Namespace, **settings: Any) -> brakeline.Run:
    """A run with test-sized intervals; offline when the environment names no console."""
    work = options.work_dir
    return brakeline.init(
        job=options.job,
        spill_dir=str(work / "spill"),
        checkpoint_dir=str(work / "checkpoints"),
        heartbeat_interval=0.2,
        flush_interval=0.05,
        backoff_base=0.05,
        backoff_cap=options.backoff_cap,
        ack_wait_before_release=5.0,
        finish_timeout=30.0,
        max_memory_points=options.max_memory_points,
        **settings,
    )


class LossFile:
    """Appends one line per step, flushed at once (the test reads it while we run)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the whole run

    def write(self, step: int, loss: float) -> None:
        self._file.write(f"{step} {float(loss).hex()}\n")

    def close(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
