"""The bounded buffer and its spill files: order, bounds, replay across processes."""

import json

from brakeline._spool import PointSpool, open_spill_directory


def _lines(start, count):
    return [
        json.dumps({"name": "loss", "step": i, "value": float(i)})
        for i in range(start, start + count)
    ]


def _drain(spool):
    steps = []
    while (batch := spool.next_batch()) is not None:
        steps.extend(json.loads(line)["step"] for line in batch.lines)
        spool.commit(batch)
    return steps


def test_memory_is_bounded_and_spill_keeps_global_order(tmp_path):
    spool = PointSpool(tmp_path, batch_points=10, max_memory_points=50)
    for start in range(0, 1000, 7):
        spool.add(_lines(start, 7))
        assert spool.memory_points <= 50
    assert spool.spilled_points > 0
    assert spool.pending_points == 1001
    assert _drain(spool) == list(range(1001))
    assert list(tmp_path.glob("*.jsonl")) == []


def test_spill_files_are_json_lines_one_batch_each(tmp_path):
    spool = PointSpool(tmp_path, batch_points=10, max_memory_points=20)
    spool.add(_lines(0, 25))
    segments = sorted(tmp_path.glob("*.jsonl"))
    assert segments
    for segment in segments:
        lines = segment.read_text().splitlines()
        assert 0 < len(lines) <= 10
        assert all(json.loads(line)["name"] == "loss" for line in lines)


def test_batches_respect_the_byte_limit(tmp_path):
    spool = PointSpool(tmp_path, batch_points=1000, batch_bytes=600)
    spool.add(_lines(0, 100))
    batch = spool.next_batch()
    assert 1 <= len(batch.lines) < 100
    assert len(batch.body()) <= 600


def test_uncommitted_batch_is_sent_again(tmp_path):
    spool = PointSpool(tmp_path, batch_points=5)
    spool.add(_lines(0, 8))
    first = spool.next_batch()
    again = spool.next_batch()  # not committed: the console did not take it
    assert first.lines == again.lines
    spool.commit(again)
    assert [json.loads(line)["step"] for line in spool.next_batch().lines] == [5, 6, 7]


def test_partial_commit_of_a_segment_keeps_the_rest(tmp_path):
    spool = PointSpool(tmp_path, batch_points=10, max_memory_points=10)
    spool.add(_lines(0, 20))  # spills all twenty, in two segments of ten
    spool.batch_points = 4  # as after a 413
    batch = spool.next_batch()
    assert batch.segment is not None and len(batch.lines) == 4
    spool.commit(batch)
    assert spool.spilled_points == 16  # both segments, the first one shortened
    assert spool.spilled_bytes == sum(p.stat().st_size for p in tmp_path.glob("*.jsonl"))
    assert _drain(spool) == list(range(4, 20))
    assert spool.spilled_points == spool.spilled_bytes == 0


def test_a_new_process_replays_what_the_last_one_left(tmp_path):
    first = PointSpool(tmp_path, batch_points=10)
    first.add(_lines(0, 35))
    first.spill_all()
    assert first.memory_points == 0
    second = PointSpool(tmp_path, batch_points=10)
    assert second.pending_points == 35
    second.add(_lines(35, 5))
    assert _drain(second) == list(range(40))


def test_spill_directory_over_its_limit_drops_the_oldest_and_counts(tmp_path, caplog):
    spool = PointSpool(tmp_path, batch_points=10, max_memory_points=10, max_spill_bytes=1500)
    spool.add(_lines(0, 200))
    assert spool.spilled_bytes <= 1500
    assert spool.dropped > 0
    assert "dropped" in caplog.text
    steps = _drain(spool)
    assert steps == sorted(steps) and steps[-1] == 199
    assert len(steps) + spool.dropped == 200


def test_unwritable_spill_drops_with_a_count_instead_of_raising(tmp_path, monkeypatch):
    spool = PointSpool(tmp_path, batch_points=10, max_memory_points=10)

    def disk_full(path, lines):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool, "_write_segment", disk_full)
    spool.add(_lines(0, 30))
    assert spool.memory_points <= 10
    assert spool.dropped == 30 - spool.memory_points


def test_spill_directory_is_locked_per_process(tmp_path):
    directory, lock = open_spill_directory(tmp_path, "job/with odd:name", 3)
    assert directory.name == "rank-3"
    assert "/" not in directory.parent.name
    # Another holder (here: the same process again) gets a separate folder, never a shared one.
    second, second_lock = open_spill_directory(tmp_path, "job/with odd:name", 3)
    assert second != directory
    lock.close()
    second_lock.close()


def test_a_batch_names_the_rank_of_its_process_and_rank_0_sends_what_it_always_sent(tmp_path):
    import json

    ranked = PointSpool(tmp_path / "r3", rank=3)
    ranked.add(_lines(0, 5))
    body = json.loads(ranked.next_batch().body())
    assert body["rank"] == 3 and len(body["points"]) == 5
    single = PointSpool(tmp_path / "r0")
    single.add(_lines(0, 5))
    assert set(json.loads(single.next_batch().body())) == {"batch", "points"}
