"""The habits that keep the house in order, enforced by the suite (CI runs `make test`): the
import contracts (``[tool.importlinter]`` in pyproject.toml: the layers, no import cycles, the
pure cores, the SDK) and the types of the project, the web layer, the services and the SDK
(``[tool.mypy]``). ``make lint`` runs both too."""

from __future__ import annotations

import os
import shutil
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


def _lint(cwd: Path, *path: Path, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    """lint-imports in ``cwd``, ``path`` found before the project's root (its tools, its
    packages)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*map(str, path), str(ROOT)]),
        "COLUMNS": "200",  # one broken import per line
    }
    options = ["--config", str(config)] if config else []
    return subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache", *options],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _lint_package(
    tmp_path: Path, a_source: str, packages: str = "cyclic"
) -> subprocess.CompletedProcess[str]:
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
        f"packages =\n    {packages}\n"
    )
    return _lint(tmp_path, tmp_path)


def test_an_import_inside_a_function_that_closes_a_cycle_breaks_the_contract(tmp_path) -> None:
    result = _lint_package(tmp_path, "def late():\n    from cyclic import b\n")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "These modules import each other: cyclic.a, cyclic.b" in result.stdout


def test_a_package_whose_modules_import_one_way_keeps_the_contract(tmp_path) -> None:
    result = _lint_package(tmp_path, "X = 1\n")
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_import_made_only_for_type_checking_that_closes_a_cycle_breaks_the_contract(
    tmp_path,
) -> None:
    a_source = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from cyclic import b\n"
    result = _lint_package(tmp_path, a_source)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "These modules import each other: cyclic.a, cyclic.b" in result.stdout


def test_a_package_the_graph_holds_only_by_name_is_refused_by_name(tmp_path) -> None:
    # Its modules would be unseen: a contract that cannot see them must not say it is kept.
    result = _lint_package(tmp_path, "X = 1\n", packages="cyclic\n    json")
    assert result.returncode != 0
    assert "'json' is not one of the root packages" in result.stdout + result.stderr


def test_a_cycle_in_the_sdk_breaks_the_projects_own_contract(tmp_path) -> None:
    """The SDK is a distribution of its own (sdk/brakeline), found on the path: a copy of it
    where the pause controller names the run that composes it, for type checking only."""
    sdk = tmp_path / "sdk"
    shutil.copytree(
        ROOT / "sdk" / "brakeline", sdk / "brakeline", ignore=shutil.ignore_patterns("__pycache__")
    )
    pause = sdk / "brakeline" / "_pause.py"
    source = pause.read_text()
    kept = _lint(tmp_path, sdk, config=ROOT / "pyproject.toml")
    assert kept.returncode == 0, kept.stdout + kept.stderr  # the copy as it is: no cycle
    pause.write_text(
        source + "\nfrom typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from brakeline._run import Run\n"
    )
    result = _lint(tmp_path, sdk, config=ROOT / "pyproject.toml")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "No import cycles between modules BROKEN" in result.stdout
    assert "- brakeline._pause -> brakeline._run (l. " in result.stdout
