"""Under Slurm the SDK tells the console where it runs: heartbeats carry the Slurm job, its
nodes and the step, and points name the node as Slurm does (the name the console drains)."""

from brakeline._settings import resolve_settings
from tests.brakeline.conftest import wait_until


def test_heartbeats_carry_the_slurm_context_under_slurm(make_run, transport, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[01-02]")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    run = make_run(rank=1)
    run.step_boundary(7)
    heartbeat = wait_until(lambda: [b for b in transport.bodies("heartbeat") if b["step"] == 7])[0]
    assert heartbeat["rank"] == 1 and heartbeat["hostname"] == run.hostname
    assert {key: heartbeat[key] for key in heartbeat if key.startswith("slurm_")} == {
        "slurm_job_id": "4242",
        "slurm_nodelist": "gpu[01-02]",
        "slurm_step_id": "0",
    }


def test_a_batch_script_sends_no_step_id(make_run, transport, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    monkeypatch.delenv("SLURM_STEP_ID", raising=False)
    make_run().step_boundary(1)
    heartbeat = wait_until(lambda: transport.bodies("heartbeat"))[0]
    assert heartbeat["slurm_job_id"] == "17" and "slurm_step_id" not in heartbeat


def test_under_slurm_points_name_the_node_as_slurm_does():
    assert resolve_settings(environ={"SLURMD_NODENAME": "gpu07"}).node == "gpu07"
    explicit = {"SLURMD_NODENAME": "gpu07", "BRAKELINE_NODE": "rack3-gpu07"}
    assert resolve_settings(environ=explicit).node == "rack3-gpu07"


def test_init_exports_the_job_marker_for_the_processes_it_starts(monkeypatch):
    """The console's local executor looks for it in /proc/PID/environ of a process before it
    signals it: a child started after init carries it from its start."""
    import os
    import subprocess
    import sys

    from brakeline._run import JOB_MARKER_VARIABLE, export_job_marker

    monkeypatch.setenv(JOB_MARKER_VARIABLE, "")  # restored (unset) after the test
    export_job_marker(resolve_settings({"token": "bkl_abcdefghijklmnop"}, environ={}))
    assert os.environ[JOB_MARKER_VARIABLE] == "bkl_abcdefgh"
    child = subprocess.run(
        [sys.executable, "-c", "print(open('/proc/self/environ', 'rb').read())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "BRAKELINE_JOB_MARKER=bkl_abcdefgh" in child.stdout
