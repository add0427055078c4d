"""The SDK is a distribution of its own (sdk/): a GPU node that installs it gets no console.

A fresh virtual environment (no system site-packages) gets the ``brakeline`` wheel built from
a copy of sdk/, installed without any index: a required dependency would make that install
fail. Then the environment must hold no server package, and ``import brakeline`` and a whole
offline ``brakeline.init`` run must work there. No network is used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[2] / "sdk"
SERVER_DISTRIBUTIONS = {
    "django",
    "djangorestframework",
    "celery",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "daphne",
    "channels",
    "channels-redis",
    "redis",
    "brakeline-console",
}
PROBE = textwrap.dedent(
    """
    import importlib.metadata, importlib.util, json, sys, tempfile
    import brakeline

    folder = tempfile.mkdtemp()
    run = brakeline.init(job="distribution", spill_dir=folder, checkpoint_dir=folder)
    run.log({"loss": 1.0}, step=1)
    run.step_boundary(1)
    run.finish()
    print(json.dumps({
        "file": brakeline.__file__,
        "version": brakeline.__version__,
        "distributions": sorted(
            d.metadata["Name"].lower().replace("_", "-")
            for d in importlib.metadata.distributions()
        ),
        "requires": importlib.metadata.requires("brakeline") or [],
        "django_importable": importlib.util.find_spec("django") is not None,
        "modules": sorted({name.split(".")[0] for name in sys.modules}),
    }))
    """
)


def _fresh_environment(folder: Path) -> Path:
    """A venv of its own (with pip, without system site-packages); skips if none can be made."""
    try:
        venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(folder)
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"cannot create a virtual environment here (venv/ensurepip): {error}")
    python = folder / "bin" / "python"
    if not python.exists():
        pytest.skip("cannot create a virtual environment here: it has no bin/python")
    return python


def _run(command: list[str | Path], cwd: Path, env: dict[str, str] | None = None) -> str:
    completed = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


def test_the_sdk_installs_alone_and_runs_without_the_console(tmp_path):
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in sdk/.
    source = tmp_path / "sdk"
    shutil.copytree(
        SDK, source, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    )
    wheels = tmp_path / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["--quiet", "--wheel-dir", wheels, source],
        cwd=tmp_path,
    )
    (wheel,) = wheels.glob("brakeline-*.whl")

    python = _fresh_environment(tmp_path / "venv")
    clean = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("BRAKELINE_", "PYTHON", "PIP_", "VIRTUAL_ENV"))
    }
    # --no-index: nothing can come from a registry, so a required dependency fails the install.
    _run(
        [python, "-m", "pip", "install", "--no-index", "--quiet", "--disable-pip-version-check"]
        + [wheel],
        cwd=tmp_path,
        env=clean,
    )
    # -I: neither the current folder nor PYTHONPATH can put the source tree on sys.path.
    report = json.loads(_run([python, "-I", "-c", PROBE], cwd=tmp_path, env=clean))

    assert Path(report["file"]).is_relative_to(tmp_path / "venv")  # the installed copy
    assert report["version"] == wheel.name.split("-")[1]
    assert "brakeline" in report["distributions"]
    assert not SERVER_DISTRIBUTIONS & set(report["distributions"]), report["distributions"]
    assert set(report["distributions"]) <= {"brakeline", "pip", "setuptools"}
    # Every dependency is behind an extra: a plain install pulls in nothing.
    assert report["requires"] and all("extra ==" in line for line in report["requires"])
    extras = {line.split("extra ==")[1].strip(" \"'") for line in report["requires"]}
    assert extras == {"torch", "ws", "lightning", "hf"}
    assert report["django_importable"] is False
    assert "django" not in report["modules"] and "torch" not in report["modules"]
