"""A newcomer's first hour: ``make demo`` on another port, a bad setting said in one sentence,
and the demo's agent token kept off the training process's command line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from console.management.commands import demo
from tests.conftest import ROOT


def manage(tmp_path: Path, *arguments: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.pop("BRAKELINE_SECRET_KEY", None)
    clean.update(BRAKELINE_DATA_DIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, "manage.py", *arguments],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "env, sentence",
    [
        (
            {"BRAKELINE_HEARTBEAT_FLOOR_SECONDS": "five"},
            "BRAKELINE_HEARTBEAT_FLOOR_SECONDS='five' is not a number of seconds above 0.",
        ),
        (
            {"DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/x"},
            "DATABASE_URL is set but REDIS_URL is not. The server mode needs both",
        ),
        # Read in config/schedule.py, which the settings import: the same presentation.
        ({"BRAKELINE_TICK_SECONDS": "0"}, "BRAKELINE_TICK_SECONDS='0' is not a number of seconds"),
    ],
)
def test_a_bad_setting_stops_manage_py_with_its_sentence_alone(tmp_path, env, sentence):
    result = manage(tmp_path, "check", **env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(sentence), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_good_settings_still_reach_the_command(tmp_path):
    result = manage(tmp_path, "check")
    assert result.returncode == 0, result.stderr
    assert "no issues" in result.stdout


PROBE = """\
import json, os, sys
with open(os.environ["PROBE_OUT"], "w") as out:
    json.dump({
        "argv": sys.argv,
        "cmdline": open("/proc/self/cmdline", "rb").read().decode().split("\\0"),
        "token": os.environ.get("BRAKELINE_TOKEN"),
        "path": sys.path,
    }, out)
"""


def test_the_demo_passes_the_agent_token_in_the_environment_only(tmp_path, monkeypatch, settings):
    """What `ps` shows of the training process (its /proc/PID/cmdline) holds no token; the
    script gets it from BRAKELINE_TOKEN (demo_training.py leaves --token to the SDK's
    environment variable)."""
    script = tmp_path / "demo_training.py"
    script.write_text(PROBE)
    monkeypatch.setattr(demo, "TRAINING_SCRIPT", script)
    monkeypatch.setenv("PROBE_OUT", str(tmp_path / "probe.json"))
    settings.DATA_DIR = tmp_path
    token = "bkl_" + "s3cret" * 6
    options = {"steps": 5, "diverge_at": None}
    demo.Command().train("http://127.0.0.1:8000", token, "demo-run", options)
    seen = json.loads((tmp_path / "probe.json").read_text())
    assert not any(token in argument for argument in seen["cmdline"]), seen["cmdline"]
    assert seen["token"] == token
    assert seen["argv"][0] == str(script)
    assert "--token" not in seen["argv"]
    assert seen["argv"][1:3] == ["--url", "http://127.0.0.1:8000"]
    assert seen["argv"][-2:] == ["--steps", "5"]
    # console/ stays off sys.path (its celery.py would shadow Celery), as with `python -P`.
    assert str(script.parent) not in seen["path"] and "" not in seen["path"]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_demo_passes_demo_args_on():
    result = subprocess.run(
        ["make", "-n", "demo", "DEMO_ARGS=--port 8001 --simulator"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "manage.py demo --port 8001 --simulator" in result.stdout


def test_a_bad_setting_stops_daphne_with_its_sentence_alone(tmp_path):
    entry = ["-m", "daphne", "-p", "0", "config.asgi:application"]
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.update(BRAKELINE_DATA_DIR=str(tmp_path), BRAKELINE_HEARTBEAT_FLOOR_SECONDS="five")
    result = subprocess.run(
        [sys.executable, *entry], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "BRAKELINE_HEARTBEAT_FLOOR_SECONDS='five'" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
