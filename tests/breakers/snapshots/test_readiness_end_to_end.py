"""Readiness graded from real sandboxes: SDK runs in real cgroups, PID and mount namespaces,
a small tmpfs as /dev/shm and real ulimits, against the real console. Nothing of the snapshot
is written by the test: the SDK probes the sandbox it runs in.

One sandbox is careless (an image tag, pip in its start-up command and a package installed
after it started, 64 MiB of /dev/shm for 4 loader workers, memlock 8 MiB, no seed); the
other is clean. Skipped, saying why, where the machine cannot make them (not root, no
unshare, no cgroup hierarchy with memory and cpu).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from breakers.models import EnvironmentSnapshot
from breakers.snapshots.queries import job_readiness
from tests.brakeline.live import training_environment
from tests.breakers.snapshots import sandboxes
from tests.support.waiting import wait_for

SCRIPT = Path(__file__).resolve().parent / "scripts" / "sandbox_run.py"
MiB = 1024**2
WHY_NOT = sandboxes.why_not()
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(WHY_NOT is not None, reason=f"real sandboxes: {WHY_NOT}"),
]


def run_in_sandbox(env, command, *, cgroup, shm_bytes, memlock, log_path):
    with log_path.open("a") as log:
        process = sandboxes.sandboxed(
            command, cgroup=cgroup, shm_bytes=shm_bytes, memlock=memlock, env=env, log=log
        )
        assert process.wait(timeout=180) == 0, log_path.read_text()[-3000:]


def checkpoint_snapshot(job_id):
    return EnvironmentSnapshot.objects.filter(job_id=job_id, kind="checkpoint").first()


def statuses(job_id):
    return {item.key: (item.status, item.reason) for item in job_readiness(job_id).items}


def test_a_careless_sandbox(live_console, make_agent, tmp_path):
    python = shlex.quote(sys.executable)
    site = tmp_path / "site"
    wheel = sandboxes.build_wheel(tmp_path)

    careless = make_agent(name="careless")
    env = training_environment(live_console, careless.token)
    env.update(BRAKELINE_IMAGE="registry.local/train:latest")
    env["PYTHONPATH"] = f"{site}{os.pathsep}{env['PYTHONPATH']}"
    command = (
        # Installing at start-up, after the container (this PID namespace) started.
        f"sleep 1.5 && {python} -m pip install -q --no-index --no-deps --target {site} {wheel} "
        f"&& {python} {SCRIPT} {tmp_path / 'careless'} 4 --no-seed"
    )
    with sandboxes.cgroups(f"brakeline-test-{os.getpid()}-a", 1024 * MiB, 0.5) as cgroup:
        run_in_sandbox(
            env,
            command,
            cgroup=cgroup,
            shm_bytes=64 * MiB,
            memlock=8 * MiB,
            log_path=tmp_path / "careless.log",
        )
    snapshot = wait_for(lambda: checkpoint_snapshot(careless.job_id), "the careless checkpoint")
    sandbox = snapshot.data["sandbox"]
    assert sandbox["cgroup"]["version"] == cgroup.version
    assert sandbox["shm"]["total_bytes"] == 64 * MiB and sandbox["loader_workers"] == 4

    found = statuses(careless.job_id)
    assert found["image"][0] == "fail" and "registry.local/train:latest" in found["image"][1]
    assert found["dependencies"][0] == "fail"
    assert "start-up command runs pip install" in found["dependencies"][1]
    assert "installed after the container started: late_extra" in found["dependencies"][1]
    assert found["seeds"][0] == "fail"
    assert found["shm"] == (
        "fail",
        "/dev/shm is 64 MiB; 4 loader workers need about 1 GiB: too small, the loader hangs "
        "silently",
    )
    assert found["memory_limit"] == ("ok", f"1 GiB (cgroup v{cgroup.version})")
    assert found["cpu_limit"] == ("ok", f"0.5 CPUs (cgroup v{cgroup.version})")
    assert found["ulimits"][0] == "warn" and "memlock is 8 MiB" in found["ulimits"][1]
    assert found["loader_state"][0] == "ok"  # the SDK's saver keeps the loader's position
    assert job_readiness(careless.job_id).grade == "not ready"


def test_a_clean_sandbox(live_console, make_agent, tmp_path):
    python = shlex.quote(sys.executable)
    clean = make_agent(name="clean")
    env = training_environment(live_console, clean.token)
    env.update(BRAKELINE_IMAGE="registry.local/train@sha256:" + "ab" * 32)
    # memlock: raised to unlimited where this machine lets root do it (CAP_SYS_RESOURCE).
    raise_memlock = "ulimit -l unlimited && " if sandboxes.can_raise_memlock() else ""
    command = f"{raise_memlock}exec {python} {SCRIPT} {tmp_path / 'clean'} 2"
    with sandboxes.cgroups(f"brakeline-test-{os.getpid()}-b", 2048 * MiB, 2) as cgroup:
        run_in_sandbox(
            env,
            command,
            cgroup=cgroup,
            shm_bytes=1024 * MiB,
            memlock=None,
            log_path=tmp_path / "clean.log",
        )
    wait_for(lambda: checkpoint_snapshot(clean.job_id), "the clean checkpoint")
    found = statuses(clean.job_id)
    not_ok = {key: value for key, value in found.items() if value[0] not in ("ok", "na")}
    # The scratch disk is this machine's, and so is memlock where it cannot be raised: only
    # they may keep the clean sandbox from "ready".
    allowed = {"scratch"} | (set() if raise_memlock else {"ulimits"})
    assert set(not_ok) <= allowed, not_ok
    assert found["shm"] == ("ok", "1 GiB for 2 loader workers")
    assert found["dependencies"] == ("ok", "nothing installed since the container started")
