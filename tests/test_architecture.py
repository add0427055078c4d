"""The habits that keep the house in order, enforced by the suite (CI runs `make test`): the
import contracts (``[tool.importlinter]`` in pyproject.toml: the layers, no import cycles, the
pure cores, the SDK) and the types of the project, the web layer, the services and the SDK
(``[tool.mypy]``). ``make lint`` runs both too."""

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


def _lint_package(tmp_path: Path, a_source: str) -> subprocess.CompletedProcess[str]:
    """lint-imports with the module-cycle contract over a two-module package of its own."""
    package = tmp_path / "cyclic"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(a_source)
    (package / "b.py").write_text("import cyclic.a\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = cyclic\n"
        "contract_types =\n    acyclic_modules: tools.import_cycles.AcyclicModulesContract\n\n"
        "[importlinter:contract:cycles]\nname = cycles\ntype = acyclic_modules\n"
        "packages =\n    cyclic\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_an_import_inside_a_function_that_closes_a_cycle_breaks_the_contract(tmp_path) -> None:
    result = _lint_package(tmp_path, "def late():\n    from cyclic import b\n")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "These modules import each other: cyclic.a, cyclic.b" in result.stdout


def test_a_package_whose_modules_import_one_way_keeps_the_contract(tmp_path) -> None:
    result = _lint_package(tmp_path, "X = 1\n")
    assert result.returncode == 0, result.stdout + result.stderr
