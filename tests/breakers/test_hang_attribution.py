"""Which rank of a silent job hung (pure, table-driven): its place is its step and whether it
went on into the next step's gradient sync; the lowest place is the one the others wait for."""

from __future__ import annotations

import json

import pytest

from breakers.agent.protocol import parse_heartbeat
from breakers.control.hang import RankPlace, attribute_hang
from core.errors import InvalidInput


def places(*rows):
    return [RankPlace(rank, step, sync, f"gpu-{rank}", 100 + rank) for rank, step, sync in rows]


@pytest.mark.parametrize(
    ("rows", "world_size", "hung", "text"),
    [
        # Rank 2 sleeps inside step 131's work; the others wait in step 131's all-reduce.
        (
            [(0, 130, 131), (1, 130, 131), (2, 130, 130), (3, 130, 131)],
            4,
            [2],
            "rank 2 of 4 is hung (gpu-2, pid 102): at step 130 it never entered step 131's "
            "gradient sync; ranks 0, 1, 3 wait on it in that collective",
        ),
        # Hung before its boundary: a step behind the others (no sync reported at all).
        (
            [(0, 12, None), (1, 11, None)],
            2,
            [1],
            "rank 1 of 2 is hung (gpu-1, pid 101): at step 11, behind the others; "
            "rank 0 waits on it at step 12",
        ),
        # Two ranks of eight hung in their work.
        (
            [(r, 50, 50 if r in (3, 6) else 51) for r in range(8)],
            8,
            [3, 6],
            "ranks 3, 6 of 8 are hung (gpu-3, gpu-6): at step 50 they never entered step 51's "
            "gradient sync; ranks 0, 1, 2, 4, 5, 7 wait on them in that collective",
        ),
        # A rank that never spoke of a sync is not taken for one inside it.
        ([(0, 7, None), (1, 7, 8)], 2, [0], None),
        # Everybody at the same place: nothing tells them apart.
        ([(0, 9, 10), (1, 9, 10)], 2, None, None),
        ([(0, 9, None), (1, 9, None), (2, 9, None)], 3, None, None),
        # One rank alone names nobody.
        ([(0, 9, None)], 1, None, None),
    ],
)
def test_the_lowest_place_is_the_hung_one(rows, world_size, hung, text):
    found = attribute_hang(places(*rows), world_size)
    if hung is None:
        assert found is None
        return
    assert found is not None and [p.rank for p in found.hung] == hung
    assert sorted(p.rank for p in found.hung + found.waiting) == [r[0] for r in rows]
    if text is not None:
        assert found.describe() == text


def test_thousands_of_waiting_ranks_are_summed_up():
    rows = [(r, 10, 11) for r in range(2000)]
    rows[1234] = (1234, 10, 10)
    found = attribute_hang(places(*rows), 2000)
    assert found is not None and [p.rank for p in found.hung] == [1234]
    text = found.describe()
    assert "ranks 0, 1, 2, 3, 4, 5, 6, 7 and 1,991 more wait on it" in text
    assert len(text) < 300


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("sync_step", -1, "must not be negative"),
        ("sync_step", 1.5, "must be a whole number"),
        ("sync_step", True, "must be a whole number"),
        ("compute_seconds", -0.1, "from 0 to"),
        ("compute_seconds", "NaN", "from 0 to"),
        ("compute_seconds", 1e7, "from 0 to"),
        ("compute_seconds", False, "from 0 to"),
    ],
)
def test_a_heartbeats_place_in_its_step_is_checked(field, value, error):
    body = {"step": 1, "status": "running", field: value}
    with pytest.raises(InvalidInput) as refused:
        parse_heartbeat(json.dumps(body).encode())
    assert error in refused.value.fields[field]


def test_a_heartbeat_says_where_its_rank_is_in_its_step():
    body = {"step": 130, "status": "running", "sync_step": 131, "compute_seconds": 0.0125}
    beat = parse_heartbeat(json.dumps(body).encode())
    assert (beat.sync_step, beat.compute_seconds) == (131, 0.0125)
    plain = parse_heartbeat(b'{"step": 1, "status": "running"}')
    assert (plain.sync_step, plain.compute_seconds) == (None, None)
