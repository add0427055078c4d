"""Helpers of the SDK's integration tests against the real console (Daphne, Celery, PostgreSQL,
Redis): training subprocesses, a console that can be stopped and restarted on its port, and
waiting for what the console stored."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bench._stack import daphne_command
from tests.conftest import ROOT, server_environment, wait_for_port
from tests.support.authz import make_member

SCRIPTS = Path(__file__).resolve().parent / "scripts"
# The deadlines below are written for a quiet machine and stretched by this factor: a training
# subprocess that imports torch on a loaded 2-core machine can take a minute to reach its first
# step. Waiting longer costs only a failing test's time; a process that dies fails at once.
PATIENCE = float(os.environ.get("BRAKELINE_TEST_PATIENCE", "4"))
# A test module on the whole live stack: the console in its own process commits what the test
# reads, and the worker runs the rules on what the training sends.
LIVE_STACK_MARKS = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("worker"),
]
# The default pack's rules that brake a non-finite step (docs/recovery.md).
NAN_RULES = ("non-finite-loss-or-gradients", "update-refused-by-guard")


def training_environment(url: str | None, token: str | None) -> dict[str, str]:
    """A training job's environment: the console (or none: offline), no network for HF."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRAKELINE_")}
    # Kept on purpose: the snapshot must redact it, and the console checks that it did.
    env["BRAKELINE_SECRET_KEY"] = os.environ.get("BRAKELINE_SECRET_KEY", "not-a-real-secret")
    # The project root for tests.*, sdk/ for brakeline where it is not installed.
    path = [str(ROOT), str(ROOT / "sdk"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, path))
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    if url and token:
        env.update(BRAKELINE_URL=url, BRAKELINE_TOKEN=token)
    return env


@dataclass
class Training:
    """One training subprocess; its losses file holds ``<step> <float.hex(loss)>`` lines."""

    name: str
    process: subprocess.Popen
    losses: Path
    work_dir: Path
    log: Path

    def steps_done(self) -> int:
        return len(self.loss_lines())

    def loss_lines(self) -> list[tuple[int, str]]:
        if not self.losses.exists():
            return []
        lines = [line.split() for line in self.losses.read_text().splitlines()]
        return [(int(step), value) for step, value in lines]

    def losses_by_step(self) -> dict[int, str]:
        return dict(self.loss_lines())

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout * PATIENCE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            message = f"{self.name} still running after {timeout * PATIENCE} s:\n{self.tail()}"
            raise AssertionError(message) from None

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class TrainingLauncher:
    """Starts training scripts; whatever is still running at the end of the test is killed."""

    tmp_path: Path
    started: list[Training] = field(default_factory=list)

    def start(
        self, script: str, name: str, *args: Any, url: str | None = None, token: str | None = None
    ) -> Training:
        work_dir = self.tmp_path / name
        work_dir.mkdir(parents=True, exist_ok=True)
        losses, log = work_dir / "losses.txt", work_dir / "output.log"
        command = [
            sys.executable,
            str(SCRIPTS / script),
            "--job",
            name,
            "--losses",
            str(losses),
            "--work-dir",
            str(work_dir),
            *map(str, args),
        ]
        with open(log, "wb") as output:
            process = subprocess.Popen(
                command,
                cwd=work_dir,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=training_environment(url, token),
            )
        training = Training(name, process, losses, work_dir, log)
        self.started.append(training)
        return training

    def stop_all(self) -> None:
        for training in self.started:
            if training.process.poll() is None:
                training.process.kill()
                training.process.wait()


class RestartableConsole:
    """Daphne on a port fixed for the whole test, so it can be stopped and started again there
    (the session's ``live_console`` cannot be: other tests use it)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = daphne_command(self.port)
        self.process = subprocess.Popen(command, cwd=ROOT, env=server_environment())
        wait_for_port(self.port, self.process)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def wait_for(
    predicate: Callable[[], Any], what: str, timeout: float = 90.0, training: Training | None = None
) -> Any:
    """Poll until predicate() is truthy; a training process that died fails at once."""
    deadline = time.monotonic() + timeout * PATIENCE
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        if training is not None and training.process.poll() is not None:
            raise AssertionError(
                f"{training.name} exited with {training.process.returncode} while waiting for "
                f"{what}:\n{training.tail()}"
            )
        time.sleep(0.05)
    raise AssertionError(
        f"still waiting after {timeout * PATIENCE:.0f} s for {what}"
        + (f"\n{training.tail()}" if training else "")
    )


def recover_automatically(job_id: int, **fields: Any) -> None:
    """The team's admin switches both NaN rules to recover automatically (one version); fields
    are further settings of those rules, such as ``recovery_budget``."""
    from breakers.detection import rulesets
    from incidents.models import Job

    team = Job.objects.get(pk=job_id).team
    admin = make_member(team, "admin")
    changes = [
        {"op": "update", "key": key, "fields": {"recovery": "recover", **fields}}
        for key in NAN_RULES
    ]
    rulesets.change_rules(admin, team.pk, "NaN batches: recover automatically", changes)


def same_losses_after(reference: Any, braked: Any, step: int, steps: int) -> None:
    """Both runs end well, and the braked run's losses after ``step`` are those of the
    reference run (one that never met what happened at ``step``), bit for bit, to ``steps``."""
    assert braked.wait(timeout=120) == 0, braked.tail()
    assert reference.wait(timeout=120) == 0, reference.tail()
    expected, after = reference.losses_by_step(), braked.losses_by_step()
    assert {s: v for s, v in after.items() if s > step} == {
        s: v for s, v in expected.items() if s > step
    }
    assert len([s for s in after if s > step]) == steps - step


def sha256_of_path(path: str | Path) -> str:
    """SHA-256 of a file, or of a folder as the SDK defines it (sorted relative names and
    contents), computed here independently of the SDK."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        digest.update(file.read_bytes())
    return digest.hexdigest()


def points_per_step(job_id: int, name: str) -> Counter[int]:
    from breakers.storage.points import stored_points

    return Counter(point.step for point in stored_points(job_id, name))
