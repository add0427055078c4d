"""The SDK's sandbox probe: pure parts table-driven, the cgroup reader on a folder laid out
like /sys/fs/cgroup, and the probe on this very process (it must never raise)."""

import os

import pytest

from brakeline import _sandbox


@pytest.mark.parametrize(
    ("command", "found"),
    [
        (["python", "train.py"], []),
        (["sh", "-c", "pip install -r req.txt && python train.py"], ["pip"]),
        (["/usr/bin/python3", "-m", "pip", "install", "x"], ["pip"]),
        (["bash", "-lc", "conda install -y numpy; python t.py"], ["conda"]),
        (["sh", "-c", "uv pip install x|tee log"], ["uv", "pip"]),
        (["python", "train.py", "--pip-cache", "install"], []),
        (["pip", "download", "x"], []),
    ],
)
def test_installers_in_start_commands(command, found):
    assert _sandbox.installers_in(command) == found


def test_v1_limits_are_the_tightest_of_the_cgroup_and_its_ancestors(tmp_path, monkeypatch):
    monkeypatch.setattr(_sandbox, "CGROUP_ROOT", tmp_path)
    leaf = tmp_path / "memory" / "jobs" / "job-7"
    leaf.mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))  # unlimited
    (tmp_path / "memory" / "jobs" / "memory.limit_in_bytes").write_text(str(8 * 2**30))
    (leaf / "memory.limit_in_bytes").write_text(str(16 * 2**30))  # the parent caps it at 8
    cpu = tmp_path / "cpu" / "jobs" / "job-7"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("150000")
    (cpu / "cpu.cfs_period_us").write_text("100000")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    limits = _sandbox._v1_limits({"memory": "/jobs/job-7", "cpu": "/jobs/job-7"})
    assert (limits["memory_max_bytes"], limits["cpu_max_cpus"]) == (8 * 2**30, 1.5)


def test_v2_limits(tmp_path):
    leaf = tmp_path / "job.slice" / "job-7"
    leaf.mkdir(parents=True)
    (tmp_path / "job.slice" / "memory.max").write_text("max")
    (leaf / "memory.max").write_text(str(2**30))
    (leaf / "cpu.max").write_text("max 100000")
    (tmp_path / "job.slice" / "cpu.max").write_text("200000 100000")
    (leaf / "cgroup.controllers").write_text("cpu memory pids")
    limits = _sandbox._v2_limits(tmp_path, "/job.slice/job-7")
    assert (limits["memory_max_bytes"], limits["cpu_max_cpus"]) == (2**30, 2.0)
    assert limits["controllers"] == ["cpu", "memory", "pids"]


def test_the_probe_of_this_process_never_raises_and_says_what_it_knows():
    facts = _sandbox.sandbox_facts(os.environ)
    assert facts["process"]["pid"] == os.getpid()
    assert facts["process"]["started_at"] and facts["shm"]["total_bytes"]
    assert facts["cgroup"]["version"] in (1, 2, None)
    assert set(facts["ulimits"]) == {"memlock", "stack", "nofile"}


def test_loader_workers():
    class Loader:
        num_workers = 4

    class Wrapped:
        loader = Loader()

    assert _sandbox.loader_workers(Wrapped()) == 4
    assert _sandbox.loader_workers([1, 2]) is None
