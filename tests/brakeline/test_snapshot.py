"""Environment snapshots: redaction, packages, git, image, scheduler context."""

import json
import subprocess
import sys

import pytest

from brakeline._commands import CommandInbox
from brakeline._push import PushListener
from brakeline.snapshot import (
    REDACTED,
    git_state,
    image_reference,
    looks_like_secret,
    redact_value,
    selected_environment,
    take_snapshot,
)

ENVIRONMENT = {
    "BRAKELINE_TOKEN": "blk_abcdef",
    "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz",
    "WANDB_API_KEY": "0123456789",
    "AWS_SECRET_ACCESS_KEY": "x",
    "DB_PASSWORD": "hunter2",
    "NCCL_SOCKET_IFNAME": "eth0",
    "CUDA_VISIBLE_DEVICES": "0,1",
    "TORCH_HOME": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc",
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NODELIST": "node-[01-08]",
    "HF_ENDPOINT": "https://user:s3cr3t@mirror.internal/hf",
    "TOKENIZERS_PARALLELISM": "false",
    "MYAPP_APIKEY": "x",
    "HOME": "/root",
    "UNRELATED": "not selected",
}


def test_secret_names_are_redacted_and_useful_values_kept():
    selected = selected_environment(ENVIRONMENT)
    for name in ("BRAKELINE_TOKEN", "HF_TOKEN", "WANDB_API_KEY"):
        assert selected[name] == REDACTED
    assert selected["NCCL_SOCKET_IFNAME"] == "eth0"
    assert selected["TOKENIZERS_PARALLELISM"] == "false"
    assert selected["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert selected["SLURM_JOB_NODELIST"] == "node-[01-08]"
    assert "HOME" not in selected and "UNRELATED" not in selected


def test_secret_words_inside_names():
    from brakeline.snapshot import is_secret_name

    for name in (
        "MYAPP_APIKEY",
        "SSH_KEYS",
        "OAUTH_CLIENT",
        "AWS_SECRET_ACCESS_KEY",
        "PGPASSWORD",
        "SENTRY_DSN",
    ):
        assert is_secret_name(name), name
    for name in ("TOKENIZERS_PARALLELISM", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"):
        assert not is_secret_name(name), name


def test_values_that_look_like_credentials_are_redacted_whatever_their_name():
    assert redact_value("TORCH_HOME", ENVIRONMENT["TORCH_HOME"]) == REDACTED
    assert redact_value("PYTHON_X", "ghp_" + "a1B2" * 9) == REDACTED
    assert redact_value("CUDA_X", "AKIAIOSFODNN7EXAMPLE") == REDACTED
    assert redact_value("HF_ENDPOINT", ENVIRONMENT["HF_ENDPOINT"]) == (
        "https://user:<redacted>@mirror.internal/hf"
    )
    assert redact_value("CONDA_X", "Zk3vQ9pL2mX8rT5wY7bN4cJ6hG1dF0sA") == REDACTED


@pytest.mark.parametrize(
    "value",
    [
        "/usr/local/cuda-12.4/lib64",
        "eth0",
        "0,1,2,3",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",  # a hash, not a key
        "sha256:9b2a3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b",
    ],
)
def test_ordinary_values_are_not_mistaken_for_secrets(value):
    assert not looks_like_secret(value)


def test_image_reference_and_whether_it_is_pinned():
    pinned = image_reference({"BRAKELINE_IMAGE": "registry/train@sha256:" + "a" * 64})
    assert pinned["pinned_by_digest"] is True and pinned["variable"] == "BRAKELINE_IMAGE"
    assert image_reference({"IMAGE_DIGEST": "registry/train:latest"})["pinned_by_digest"] is False
    assert image_reference({})["reference"] is None


def test_git_commit_of_a_repository_and_none_outside(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    commands = [
        ["git", "init", "-q"],
        [
            "git",
            "-c",
            "user.email=a@b",
            "-c",
            "user.name=a",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
    ]
    for command in commands:
        subprocess.run(command, cwd=repo, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert git_state(str(repo)) == {"commit": head, "dirty": False}
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert git_state(str(outside)) == {"commit": None}
    monkeypatch.setenv("PATH", "")  # no git at all: still no exception
    assert git_state(str(repo)) == {"commit": None}


def test_full_snapshot_is_json_and_has_every_section(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("MY_SERVICE_TOKEN", "should-not-leak")
    snapshot = take_snapshot(
        rank=2,
        node="node-07",
        seeds={"global": 7},
        data_position={"epoch": 1, "batch_in_epoch": 5},
        extra_env_prefixes=("MY_",),
    )
    text = json.dumps(snapshot, allow_nan=False)
    assert "should-not-leak" not in text
    assert snapshot["environment"]["MY_SERVICE_TOKEN"] == REDACTED
    assert snapshot["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert snapshot["packages"]["pytest"]
    assert snapshot["scheduler"]["SLURM_JOB_ID"] == "4242"
    assert snapshot["scheduler"]["rank"] == 2 and snapshot["scheduler"]["node"] == "node-07"
    assert snapshot["seeds"] == {"global": 7}
    assert snapshot["data_position"] == {"epoch": 1, "batch_in_epoch": 5}
    assert snapshot["resources"]["cpus"] >= 1
    assert "commit" in snapshot["git"]


def test_push_messages_feed_the_inbox_and_junk_is_ignored():
    inbox = CommandInbox()
    listener = PushListener("ws://console.invalid/ws/agent/", "tok en", inbox)
    assert listener.url == "ws://console.invalid/ws/agent/?token=tok+en"
    ranked = PushListener("ws://console.invalid/ws/agent/", "t", inbox, rank=0)
    assert ranked.url == "ws://console.invalid/ws/agent/?token=t&rank=0"  # a multi-rank job's
    listener._handle(json.dumps({"type": "command", "command": {"id": 3, "kind": "resume"}}))
    listener._handle("not json")
    listener._handle(json.dumps({"type": "hello"}))
    assert inbox.take().id == 3 and inbox.take() is None


def test_without_websockets_the_push_listener_steps_aside(monkeypatch):
    monkeypatch.setitem(sys.modules, "websockets.sync.client", None)
    assert PushListener("ws://x/ws/agent/", "t", CommandInbox()).start() is False


def test_a_half_imported_torch_does_not_break_the_snapshot(monkeypatch):
    """``import torch`` after ``brakeline.init``: the snapshot thread may run while torch is
    still initialising in the training thread; touching it then raises "partially initialized
    module". The snapshot leaves the accelerators out instead of failing."""
    import importlib.machinery
    import types

    from brakeline.snapshot import take_snapshot

    class HalfImported(types.ModuleType):
        def __getattr__(self, name):
            raise AttributeError(f"partially initialized module 'torch' has no attribute {name!r}")

    half = HalfImported("torch")
    half.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    half.__spec__._initializing = True  # what importlib sets while the module is executing
    monkeypatch.setitem(sys.modules, "torch", half)
    snapshot = take_snapshot(rank=0, node="n", seeds={}, data_position=None)
    assert "accelerators" not in snapshot["resources"]
    json.dumps(snapshot)
