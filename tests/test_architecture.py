"""The habits that keep the house in order, enforced by the suite (CI runs `make test`): the
import contracts (``[tool.importlinter]`` in pyproject.toml: the layers, the pure cores, the
SDK) and the services' types (``[tool.mypy]``). ``make lint`` runs both too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*command: str | Path) -> subprocess.CompletedProcess[str]:
    # The same packages as this process sees (pytest's pythonpath: the console, the SDK).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [str(part) for part in command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_import_contracts_are_kept() -> None:
    result = run(BIN / "lint-imports")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_services_type_check() -> None:
    result = run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr
