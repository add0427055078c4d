"""Checkpoint sets under real torchrun (2 ranks, gloo on CPU) against the real console: the
set reaches the catalogue; resuming from the latest complete set, then rolling back in place to a
set, reproduce the uninterrupted losses bit for bit on every rank."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import brakeline
from breakers.checkpoints import catalogue, roll_back_params, roll_back_target
from breakers.models import Checkpoint, CheckpointSet
from core.errors import InvalidInput
from tests.brakeline.live import wait_for
from tests.brakeline.torchrun import torchrun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STEPS = 30


def _a_lone_rank_file_is_no_target(job_id: int, lone: Checkpoint) -> None:
    """A rank's file outside a complete set is no roll back target, and the rank is named."""
    Checkpoint.objects.create(
        job_id=job_id,
        path="/x/step-00000027.pt",
        sha256="a" * 64,
        step=27,
        rank=0,
        reason="manual",
        reported_at=lone.reported_at,
    )
    with pytest.raises(InvalidInput) as refused:
        roll_back_target(job_id, "/x/step-00000027.pt")
    assert "rank(s) 1 missing" in refused.value.fields["checkpoint"]


def test_resume_and_roll_back_from_a_set_reproduce_the_uninterrupted_losses(
    live_console, agent, tmp_path
):
    reference = torchrun(
        tmp_path / "reference",
        "--steps",
        str(STEPS),
        "--checkpoint-at",
        "10",
        "--checkpoint-at",
        "20",
        console=live_console,
        token=agent.token,
    )
    assert reference.wait() == 0, reference.tail()
    uninterrupted = {rank: reference.losses(rank) for rank in (0, 1)}
    assert [step for step, _ in uninterrupted[1]] == list(range(1, STEPS + 1))
    assert uninterrupted[0] != uninterrupted[1]  # each rank its own shard of the data

    # The console: two complete sets, the catalogue offers them (rank 0's file, with the set).
    wait_for(lambda: CheckpointSet.objects.filter(job_id=agent.job_id).count() == 2, "two sets")
    entries = catalogue(agent.job_id)
    assert [entry["step"] for entry in entries] == [20, 10]
    assert all(e["set"]["world_size"] == 2 and len(e["set"]["shards"]) == 2 for e in entries)
    lone = Checkpoint.objects.get(job_id=agent.job_id, step=20, rank=1)
    assert lone.checkpoint_set_id is not None

    # Resume: rank 1's file of step 20 is lost, so both ranks resume from step 10's set.
    resumed_dir = tmp_path / "resumed"
    # A copy of the sets: their manifests name shards relative to the folder, so the copy
    # resumes from its own files (its rank 1 lost step 20's; the original still has it).
    shutil.copytree(reference.work / "checkpoints", resumed_dir / "checkpoints")
    (resumed_dir / "checkpoints" / "step-00000020.rank-1.pt").unlink()
    # Then, at step 25, roll back in place to step 10's set with the params the console's
    # resume carries: steps 11..30 after it are the uninterrupted ones again.
    target = roll_back_target(agent.job_id, str(entries[1]["id"]))
    params = roll_back_params(target)
    assert [shard["rank"] for shard in params["set"]["shards"]] == [0, 1]
    (tmp_path / "params.json").write_text(json.dumps(params))
    resumed = torchrun(
        resumed_dir,
        "--steps",
        str(STEPS),
        "--resume",
        "--roll-back-at",
        "25",
        "--roll-back-params",
        str(tmp_path / "params.json"),
    )
    assert resumed.wait() == 0, resumed.tail()
    assert "rank 1's shard" in resumed.tail()  # the skipped set named its rank
    for rank in (0, 1):
        losses = resumed.losses(rank)
        assert losses[:15] == uninterrupted[rank][10:25], f"rank {rank} resumed"
        assert losses[15:] == uninterrupted[rank][10:], f"rank {rank} rolled back"

    _a_lone_rank_file_is_no_target(agent.job_id, lone)


def test_a_set_of_torch_distributed_checkpoint_shards_resumes_bit_for_bit(tmp_path):
    reference = torchrun(tmp_path / "reference", "--steps", "16", "--checkpoint-at", "8", "--dcp")
    assert reference.wait() == 0, reference.tail()
    found = brakeline.latest_set(tmp_path / "reference" / "checkpoints", 1)
    assert found.step == 8 and all(s["path"].endswith(".dcp") for s in found.shards)
    assert all(Path(s["path"], ".metadata").is_file() for s in found.shards)  # DCP's own layout
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(reference.work / "checkpoints", resumed_dir / "checkpoints")
    resumed = torchrun(resumed_dir, "--steps", "16", "--resume", "--dcp")
    assert resumed.wait() == 0, resumed.tail()
    for rank in (0, 1):
        assert resumed.losses(rank) == reference.losses(rank)[8:], f"rank {rank}"


def test_on_three_ranks_roll_back_in_place_is_exact_and_a_new_process_is_without_rebuilt_buckets(
    tmp_path,
):
    """What docs/sdk.md guarantees beyond two ranks. DDP rebuilds its gradient buckets once,
    after its first step, in the order the gradients became ready; with three ranks or more the
    all-reduce sums each element in an order that depends on its place in the bucket, so a new
    process (whose first step uses the initial layout) may differ from the uninterrupted run by
    a float32 ULP. In place, the same DDP keeps its buckets: exact. A DDP that never rebuilds
    them (find_unused_parameters=True here) resumes exactly in a new process too."""
    roll_back = ("--roll-back-at", "12", "--roll-back-to", "8")
    rolled = torchrun(
        tmp_path / "rolled", "--steps", "16", "--checkpoint-at", "8", *roll_back, ranks=3
    )
    assert rolled.wait() == 0, rolled.tail()
    for rank in range(3):
        losses = rolled.losses(rank)
        assert [s for s, _ in losses] == [*range(1, 13), *range(9, 17)]
        assert losses[12:16] == losses[8:12], f"rank {rank} rolled back in place"

    no_rebuild = ("--ddp-option", "find_unused_parameters=true")
    reference = torchrun(
        tmp_path / "reference", "--steps", "16", "--checkpoint-at", "8", *no_rebuild, ranks=3
    )
    assert reference.wait() == 0, reference.tail()
    shutil.copytree(reference.work / "checkpoints", tmp_path / "resumed" / "checkpoints")
    resumed = torchrun(tmp_path / "resumed", "--steps", "16", "--resume", *no_rebuild, ranks=3)
    assert resumed.wait() == 0, resumed.tail()
    for rank in range(3):
        assert resumed.losses(rank) == reference.losses(rank)[8:], f"rank {rank} resumed"
