"""Checkpoints without torch: atomic replacement, durability, SHA-256, naming."""

import hashlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import brakeline
from brakeline._checkpoint import checkpoint_path, remove_abandoned_temporaries, save_atomically


def test_atomic_save_reports_size_time_and_sha256(tmp_path):
    result = save_atomically(
        tmp_path / "ck" / "a.bin", 3, lambda path, step: path.write_bytes(b"x" * 1000)
    )
    data = (tmp_path / "ck" / "a.bin").read_bytes()
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert result.bytes == 1000 and result.step == 3 and result.seconds >= 0
    assert os.listdir(tmp_path / "ck") == ["a.bin"]  # no temporary left behind


def test_a_save_that_dies_midway_leaves_the_previous_checkpoint_intact(tmp_path):
    target = tmp_path / "model.pt"
    save_atomically(target, 1, lambda path, step: path.write_bytes(b"good checkpoint"))

    def dies_midway(path, step):
        path.write_bytes(b"half of a chec")
        raise KeyboardInterrupt  # even a BaseException must not leave junk

    with pytest.raises(KeyboardInterrupt):
        save_atomically(target, 2, dies_midway)
    assert target.read_bytes() == b"good checkpoint"
    assert os.listdir(tmp_path) == ["model.pt"]


def test_the_temporary_file_lives_in_the_destination_folder(tmp_path):
    seen = []
    save_atomically(
        tmp_path / "d" / "x.pt", 1, lambda path, step: seen.append(path) or path.write_bytes(b"1")
    )
    assert seen[0].parent == tmp_path / "d" and seen[0].name != "x.pt"


def test_folder_checkpoints_are_hashed_and_replaced_whole(tmp_path):
    def write_folder(path, step):
        path.mkdir()
        (path / "weights.bin").write_bytes(b"w" * step)
        (path / "optimizer.bin").write_bytes(b"o")

    first = save_atomically(tmp_path / "checkpoint", 5, write_folder)
    second = save_atomically(tmp_path / "checkpoint", 6, write_folder)
    assert first.sha256 != second.sha256
    assert second.bytes == 7
    assert brakeline.sha256_of(tmp_path / "checkpoint") == second.sha256


def test_latest_checkpoint_picks_the_highest_step(tmp_path):
    for step in (5, 120, 40):
        checkpoint_path(tmp_path, step).write_bytes(b"")
    checkpoint_path(tmp_path, 999, rank=1).write_bytes(b"")
    assert brakeline.latest_checkpoint(tmp_path) == tmp_path / "step-00000120.pt"
    assert brakeline.latest_checkpoint(tmp_path, rank=1).name == "step-00000999.rank-1.pt"
    assert brakeline.latest_checkpoint(tmp_path / "missing") is None


_KILLED_MIDWAY = """
import sys, time
from brakeline._checkpoint import save_atomically

def saver(path, step):
    path.write_bytes(b"half of a checkpoint")
    print(path, flush=True)
    time.sleep(600)

save_atomically(sys.argv[1], 7, saver)
"""


def test_a_save_killed_midway_leaves_its_temporary_until_the_next_save(tmp_path):
    writer = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MIDWAY, str(tmp_path / "step-00000007.pt")],
        stdout=subprocess.PIPE,
        text=True,
    )
    temporary = Path(writer.stdout.readline().strip())  # it is writing now
    # A live writer's temporary is its own: another save in the folder leaves it alone.
    save_atomically(tmp_path / "step-00000006.pt", 6, lambda p, s: p.write_bytes(b"6"))
    assert temporary.exists()
    writer.kill()
    writer.wait()
    writer.stdout.close()
    assert temporary.exists()  # SIGKILL: no cleanup of its own
    save_atomically(tmp_path / "step-00000008.pt", 8, lambda p, s: p.write_bytes(b"8"))
    assert sorted(os.listdir(tmp_path)) == ["step-00000006.pt", "step-00000008.pt"]


def test_only_temporaries_of_dead_writers_of_this_host_are_removed(tmp_path):
    script = "import os; print(os.getpid())"
    dead = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    dead_pid, live_pid, hex32 = int(dead.stdout), os.getppid(), "0" * 32
    host = socket.gethostname()
    names = {
        f".step-1.pt.tmp-{host}-{dead_pid}-{hex32}": True,  # dead writer of this host
        f".step-2.pt.tmp-{host}-{live_pid}-{hex32}": False,  # live writer
        f".step-3.pt.tmp-other-node-{dead_pid}-{hex32}": False,  # another host's pid
        f".step-4.pt.tmp-{dead_pid}-{hex32}": False,  # an earlier SDK's, recent
        f".step-5.pt.tmp-{dead_pid}-{hex32}": True,  # an earlier SDK's, two hours old
        "step-6.pt": False,
    }
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(tmp_path / f".step-5.pt.tmp-{dead_pid}-{hex32}", (two_hours_ago, two_hours_ago))
    removed = remove_abandoned_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == sorted(n for n, gone in names.items() if gone)
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, gone in names.items() if not gone)
