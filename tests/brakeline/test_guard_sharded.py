"""The step guard under FSDP (fully_shard) with real torchrun + gloo ranks.

A gradient's non-finite element in one rank's shard is seen by that rank only; every rank must
refuse the same update all the same, with one all-reduce per step (the guard checks its own
shards and agrees on one flag), not one collective per parameter as operations on the sharded
tensors themselves would cost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
SCRIPT = Path(__file__).parent / "scripts" / "guard_sharded.py"
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run_ranks(tmp_path: Path, device_mode: str) -> list[dict]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc_per_node", "2", str(SCRIPT), str(tmp_path), "--device-mode", device_mode]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize(
    ("device_mode", "refused"),
    # On the device path the flag is read one step late, so the next update is refused too.
    [("auto", [4]), ("always", [4, 5])],
    ids=["host-flag", "device-path"],
)
def test_an_inf_in_one_ranks_shard_is_refused_by_every_rank(tmp_path, device_mode, refused):
    reports = run_ranks(tmp_path, device_mode)
    for report in reports:
        assert report["skipped"] == refused, reports
        assert [int(s) for s, same in report["unchanged"].items() if same] == refused, reports
        assert report["finite"] is True
        assert report["collectives_per_step"] == 1, reports  # one agreement, not per parameter
