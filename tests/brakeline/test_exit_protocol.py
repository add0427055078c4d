"""The exit protocol of terminate: the marker, the code under a launcher, a relaunch leaving."""

import os
from pathlib import Path

import pytest

import brakeline
from brakeline._exit import (
    EXIT_TERMINATED_UNDER_LAUNCHER,
    exit_if_terminated,
    launcher_fields,
    terminate_exit_code,
    write_marker,
)

TORCHRUN = {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "0"}


def test_the_exit_code_is_success_under_torchrun_and_75_elsewhere():
    assert terminate_exit_code(TORCHRUN) == EXIT_TERMINATED_UNDER_LAUNCHER == 0
    assert terminate_exit_code({}) == brakeline.EXIT_TERMINATED == 75


def test_a_relaunch_of_the_terminated_launch_exits_at_once_and_a_new_launch_starts(tmp_path):
    codes = []
    exit_if_terminated(tmp_path, TORCHRUN, codes.append)
    assert codes == []  # nothing terminated yet
    assert write_marker(tmp_path, TORCHRUN, 17, 42, 1) is not None
    exit_if_terminated(tmp_path, {**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "1"}, codes.append)
    assert codes == [0]
    exit_if_terminated(tmp_path, {"TORCHELASTIC_RUN_ID": "another launch"}, codes.append)
    exit_if_terminated(tmp_path, {}, codes.append)  # no launcher: no relaunch to stop
    assert codes == [0]
    assert [p.name for p in tmp_path.iterdir()] == [".brakeline-terminated.json"]


def test_init_of_a_relaunched_rank_exits_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    write_marker(tmp_path, {"SLURM_JOB_ID": "4242"}, 3, 9, 0)
    codes = []
    with pytest.raises(SystemExit):

        def leave(code):
            codes.append(code)
            raise SystemExit(code)

        brakeline.init(job="x", checkpoint_dir=str(tmp_path), exit_function=leave)
    assert codes == [75]


def test_the_launcher_fields_name_the_parent_with_its_start_time():
    assert launcher_fields({}) == {}
    fields = launcher_fields(TORCHRUN)
    parent = os.getppid()
    stat = Path(f"/proc/{parent}/stat").read_text().rpartition(")")[2].split()
    assert fields == {
        "launcher_pid": parent,
        "launcher_pgid": int(stat[2]),
        "launcher_start_time": int(stat[19]),
    }
