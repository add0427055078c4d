"""Checkpoints without torch: atomic replacement, durability, SHA-256, naming."""

import hashlib
import os

import pytest

import brakeline
from brakeline._checkpoint import checkpoint_path, save_atomically


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
