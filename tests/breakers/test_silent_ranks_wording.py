"""How the heartbeat alert names silent ranks: counted against the job's size, a few named,
so a thousand-rank job's alert stays one line (pure: unsaved rows, no database)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from breakers.control.heartbeats import Silence, _who
from incidents.models import Job, JobRank

WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def _silence(silent: list[int], others: int) -> Silence:
    ranks = tuple(
        JobRank(rank=r, hostname=f"gpu-{r // 8}", pid=5000 + r, step=10, last_heartbeat_at=WHEN)
        for r in silent
    )
    return Silence(since=WHEN, step=10, step_time=None, ranks=ranks, others=others)


@pytest.mark.parametrize(
    ("silent", "others", "world", "said"),
    [
        (
            [713],
            999,
            1000,
            "rank 713 of 1,000 is silent (gpu-89, pid 5713); 999 other ranks still heartbeating: ",
        ),
        (
            [12, 713],
            998,
            1000,
            "ranks 12, 713 of 1,000 are silent (gpu-1, gpu-89); "
            "998 other ranks still heartbeating: ",
        ),
        (
            [12, 20, 713],
            997,
            1000,
            "ranks 12, 20, 713 of 1,000 are silent "
            "(gpu-1, gpu-2, gpu-89); 997 other ranks still heartbeating: ",
        ),
        (
            [12, 713, 800, 801, 802, 900, 999],
            993,
            1000,
            "ranks 12, 713 and 5 more of 1,000 "
            "are silent (gpu-1, gpu-89 and 3 more); 993 other ranks still heartbeating: ",
        ),
        (
            list(range(1000)),
            0,
            1000,
            "ranks 0, 1 and 998 more of 1,000 are silent (gpu-0, gpu-1 and 123 more): ",
        ),
        (
            [1],
            1,
            None,
            "rank 1 of 2 is silent (gpu-0, pid 5001); 1 other rank still heartbeating: ",
        ),
        ([0], 0, 1, ""),
    ],
)
def test_silent_ranks_are_counted_and_a_few_named(silent, others, world, said):
    assert _who(_silence(silent, others), Job(world_size=world)) == said
