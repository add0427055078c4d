"""Batch ids (protocol 2): a batch sent again carries the same id and the same points.

The console stores a batch id once (tests/breakers/test_batch_idempotency.py); that is only
worth something if the SDK never sends two different sets of points under one id, and never
one set of points under two ids while an answer may have been lost.
"""

from __future__ import annotations

import json

from brakeline._spool import PointSpool
from brakeline._transport import TransportError
from tests.brakeline.conftest import RecordingTransport, wait_until


def _lines(start: int, count: int) -> list[str]:
    return [
        json.dumps({"name": "loss", "step": i, "value": float(i)})
        for i in range(start, start + count)
    ]


def _steps(batch) -> list[int]:
    return [json.loads(line)["step"] for line in batch.lines]


def test_an_unanswered_batch_keeps_its_id_and_its_points_while_more_are_logged(tmp_path):
    spool = PointSpool(tmp_path, batch_points=10)
    spool.add(_lines(0, 4))
    first = spool.next_batch()
    spool.add(_lines(4, 4))  # logged while the first send's answer is lost
    again = spool.next_batch()
    assert again.batch_id == first.batch_id and _steps(again) == [0, 1, 2, 3]
    assert json.loads(again.body())["batch"] == first.batch_id
    spool.commit(again)
    following = spool.next_batch()
    assert following.batch_id != first.batch_id and _steps(following) == [4, 5, 6, 7]


def test_ids_are_unique_per_process_and_carry_the_run_id(tmp_path):
    one = PointSpool(tmp_path / "a", batch_points=2)
    other = PointSpool(tmp_path / "b", batch_points=2)
    ids = set()
    for spool in (one, other):
        spool.add(_lines(0, 6))
        while (batch := spool.next_batch()) is not None:
            assert batch.batch_id.startswith(spool.run_id + "-")
            ids.add(batch.batch_id)
            spool.commit(batch)
    assert len(ids) == 6 and one.run_id != other.run_id


def test_a_sealed_batch_spilled_to_disk_keeps_its_id_for_the_next_process(tmp_path):
    spool = PointSpool(tmp_path, batch_points=5, max_memory_points=10)
    spool.add(_lines(0, 5))
    in_flight = spool.next_batch()  # sent; the console may have stored it
    spool.add(_lines(5, 20))  # the outage goes on: memory spills, the sealed head first
    spool.spill_all()
    successor = PointSpool(tmp_path, batch_points=5)
    replayed = successor.next_batch()
    assert replayed.batch_id == in_flight.batch_id and _steps(replayed) == [0, 1, 2, 3, 4]
    seen = []
    while (batch := successor.next_batch()) is not None:
        seen.extend(_steps(batch))
        successor.commit(batch)
    assert seen == list(range(25))


def test_a_413_cuts_the_sealed_batch_into_new_ones(tmp_path):
    spool = PointSpool(tmp_path, batch_points=8)
    spool.add(_lines(0, 8))
    refused = spool.next_batch()
    spool.batch_points = 4
    spool.unseal()  # what the sender does on 413: nothing of it was stored
    halves = [spool.next_batch()]
    spool.commit(halves[0])
    halves.append(spool.next_batch())
    assert [_steps(h) for h in halves] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len({refused.batch_id, *(h.batch_id for h in halves)}) == 3


def test_a_segment_cut_by_a_smaller_batch_size_gets_stable_ids_per_cut(tmp_path):
    spool = PointSpool(tmp_path, batch_points=6, max_memory_points=6)
    spool.add(_lines(0, 12))  # spills one segment of 6
    spool.batch_points = 4
    cut = spool.next_batch()
    assert spool.next_batch().batch_id == cut.batch_id  # a retry of the cut: same id
    spool.commit(cut)
    rest = spool.next_batch()
    assert _steps(rest) == [4, 5] and rest.batch_id not in (cut.batch_id,)


def test_a_lost_answer_resends_the_same_batch_id(make_run, transport: RecordingTransport):
    """The console stored the batch but its answer never came: the retry is the same batch."""
    lost = {"left": 1}

    def lose_first_answer(path, body):
        if path == "metrics" and lost["left"]:
            lost["left"] -= 1
            raise TransportError("connection reset after the console committed (test)")
        return None

    transport.responder = lose_first_answer
    run = make_run()
    for step in range(5):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    assert run.flush(timeout=30)
    wait_until(lambda: len(transport.bodies("metrics")) >= 2)
    first, second = transport.bodies("metrics")[:2]
    assert first["batch"] == second["batch"] and first["points"] == second["points"]


def test_a_batch_of_an_older_sdk_on_disk_gets_an_id_when_adopted(tmp_path):
    (tmp_path / "000000000003.jsonl").write_text("\n".join(_lines(0, 3)) + "\n")
    spool = PointSpool(tmp_path, batch_points=10)
    batch = spool.next_batch()
    assert batch.batch_id and _steps(batch) == [0, 1, 2]


def test_a_spill_file_with_a_strange_name_gets_a_fresh_id(tmp_path):
    (tmp_path / '000000000001.a"b.jsonl').write_text("\n".join(_lines(0, 2)) + "\n")
    batch = PointSpool(tmp_path, batch_points=10).next_batch()
    assert json.loads(batch.body())["batch"] != 'a"b' and _steps(batch) == [0, 1]
