"""Checkpoint sets without torch: the manifest, complete sets only, the rank at fault named."""

import json
import shutil
from pathlib import Path

import pytest

import brakeline
from brakeline._checkpoint import (
    checkpoint_path,
    manifest_path,
    save_atomically,
    shard_to_restore,
    write_manifest,
)


def _write_set(directory, step, world_size=3):
    shards = []
    for rank in range(world_size):
        body = f"rank {rank} at step {step}".encode()
        path = checkpoint_path(directory, step, rank)
        saved = save_atomically(path, step, lambda p, s, body=body: p.write_bytes(body))
        shards.append(
            {
                "rank": rank,
                "path": saved.path,
                "bytes": saved.bytes,
                "sha256": saved.sha256,
                "step": step,
            }
        )
    return write_manifest(directory, step, world_size, shards)


def test_the_manifest_lists_every_rank_and_is_read_back_with_its_hash(tmp_path):
    written = _write_set(tmp_path, 10)
    read = brakeline.read_manifest(manifest_path(tmp_path, 10), written.sha256)
    assert read == written
    assert [s["rank"] for s in read.shards] == [0, 1, 2]
    body = json.loads(manifest_path(tmp_path, 10).read_text())
    assert body["format"] == "brakeline-checkpoint-set/1" and body["world_size"] == 3
    brakeline.verify_set(read, hash_ranks=(0, 1, 2))


def test_a_set_missing_a_rank_is_not_written(tmp_path):
    written = _write_set(tmp_path, 10)
    with pytest.raises(brakeline.IncompleteCheckpointSet, match="rank 1's shard is missing") as e:
        write_manifest(tmp_path, 20, 3, [s for s in written.shards if s["rank"] != 1])
    assert e.value.rank == 1
    off_step = [dict(s, step=11 if s["rank"] == 2 else 10) for s in written.shards]
    with pytest.raises(brakeline.IncompleteCheckpointSet, match="rank 2 saved step 11") as e:
        write_manifest(tmp_path, 10, 3, off_step)
    assert not manifest_path(tmp_path, 20).exists()


def test_latest_checkpoint_sees_only_complete_sets(tmp_path, caplog):
    _write_set(tmp_path, 10)
    newest = _write_set(tmp_path, 20)
    # A rank's lone file of a later step (the "132, 132, 131") is no set.
    save_atomically(checkpoint_path(tmp_path, 30, 2), 30, lambda p, s: p.write_bytes(b"x"))
    for rank in range(3):
        assert brakeline.latest_checkpoint(tmp_path, rank=rank, world_size=3).name.startswith(
            "step-00000020"
        )
    # Rank 1's shard of step 20 lost: every rank falls back to step 10's set, rank 1 named.
    (tmp_path / "step-00000020.rank-1.pt").unlink()
    for rank in range(3):
        found = brakeline.latest_checkpoint(tmp_path, rank=rank, world_size=3)
        assert found.name.startswith("step-00000010")
    assert "rank 1's shard" in caplog.text and "missing" in caplog.text
    assert newest.step == 20


def test_a_mismatched_or_missing_shard_is_refused_naming_the_rank(tmp_path):
    written = _write_set(tmp_path, 10)
    params = {"set": {"manifest": written.path, "manifest_sha256": written.sha256}}
    assert shard_to_restore(params, 2)[1] == written.shards[2]["sha256"]
    (tmp_path / "step-00000010.rank-2.pt").write_bytes(b"rank 2 at step 99")  # same size
    with pytest.raises(brakeline.IncompleteCheckpointSet, match="rank 2's shard") as e:
        shard_to_restore(params, 2)
    assert e.value.rank == 2
    (tmp_path / "step-00000010.rank-1.pt").unlink()
    with pytest.raises(brakeline.IncompleteCheckpointSet, match="rank 1's shard .* missing"):
        shard_to_restore(params, 0)
    wrong = {"set": {"manifest": written.path, "manifest_sha256": "0" * 64}}
    with pytest.raises(brakeline.IncompleteCheckpointSet, match="manifest .* has sha256"):
        shard_to_restore(wrong, 0)


def test_roll_back_refuses_a_set_with_a_bad_shard_and_names_the_rank(tmp_path):
    written = _write_set(tmp_path, 10, world_size=2)
    (tmp_path / "step-00000010.rank-1.pt").write_bytes(b"rank 1 at step 77")
    run = brakeline.init(job="sets", rank=1, checkpoint_dir=str(tmp_path), spill_dir=str(tmp_path))
    run.set_saver(lambda p, s: p.write_bytes(b"-"))
    params = {
        "checkpoint": written.shards[0]["path"],
        "set": {"manifest": written.path, "manifest_sha256": written.sha256},
    }
    with pytest.raises(brakeline.CommandFailed, match="rank 1's shard") as e:
        run.roll_back(params)
    assert e.value.result == {"rank": 1}
    run.finish()


def test_a_moved_set_is_found_and_resumed_where_it_now_is(tmp_path):
    _write_set(tmp_path / "ckpt", 10)
    (tmp_path / "ckpt").rename(tmp_path / "ckpt2")
    for rank in range(3):
        found = brakeline.latest_checkpoint(tmp_path / "ckpt2", rank=rank, world_size=3)
        assert found is not None and found.parent == tmp_path / "ckpt2"
        assert found.read_bytes() == f"rank {rank} at step 10".encode()
    body = json.loads(manifest_path(tmp_path / "ckpt2", 10).read_text())
    assert [s["path"] for s in body["shards"]] == [
        "step-00000010.pt",
        "step-00000010.rank-1.pt",
        "step-00000010.rank-2.pt",
    ]


def test_a_copied_set_reads_its_own_files_not_the_originals(tmp_path):
    written = _write_set(tmp_path / "ckpt", 10)
    shutil.copytree(tmp_path / "ckpt", tmp_path / "copy")
    (tmp_path / "ckpt" / "step-00000010.rank-1.pt").unlink()  # the original loses a shard
    copy = brakeline.latest_set(tmp_path / "copy", rank=1)
    assert copy is not None and copy.sha256 == written.sha256
    assert {Path(s["path"]).parent for s in copy.shards} == {tmp_path / "copy"}
    params = {"set": {"manifest": copy.path, "manifest_sha256": copy.sha256}}
    assert shard_to_restore(params, 1)[0] == tmp_path / "copy" / "step-00000010.rank-1.pt"
    assert brakeline.latest_set(tmp_path / "ckpt", rank=0) is None


@pytest.mark.parametrize("how", ["in place", "moved", "copied"])
def test_a_manifest_of_absolute_paths_is_still_read(tmp_path, how):
    """Manifests written before paths were relative name each shard absolutely."""
    written = _write_set(tmp_path / "ckpt", 10, world_size=2)
    absolute = {
        "format": "brakeline-checkpoint-set/1",
        "step": 10,
        "world_size": 2,
        "shards": [
            dict(s, path=str(tmp_path / "ckpt" / Path(s["path"]).name)) for s in written.shards
        ],
    }
    manifest_path(tmp_path / "ckpt", 10).write_text(json.dumps(absolute))
    folder = tmp_path / "ckpt"
    if how != "in place":
        folder = tmp_path / "elsewhere"
        (shutil.copytree if how == "copied" else shutil.move)(tmp_path / "ckpt", folder)
    for rank in range(2):
        found = brakeline.latest_checkpoint(folder, rank=rank, world_size=2)
        assert found is not None and found.parent == folder
