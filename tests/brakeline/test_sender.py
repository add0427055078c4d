"""run.log -> batches -> console, through the SDK's transport seam (no server needed)."""

import logging
import time

import pytest

from brakeline._transport import Response
from tests.brakeline.conftest import wait_until


def test_points_are_batched_by_size(make_run, transport):
    run = make_run(batch_points=100, flush_interval=10.0)
    for step in range(1000):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    assert run.flush(5.0)
    batches = transport.bodies("metrics")
    assert all(len(body["points"]) <= 100 for body in batches)
    # 1000 losses + 1000 nonfinite.loss counts, at most 100 per batch
    assert sum(len(body["points"]) for body in batches) == 2000
    assert len(batches) >= 20


def test_a_few_points_leave_after_the_flush_interval_without_flush(make_run, transport):
    run = make_run(flush_interval=0.05)
    run.log({"grad_norm": 2.0}, step=3)
    points = wait_until(transport.points)
    assert points[0]["name"] == "grad_norm" and points[0]["step"] == 3
    assert points[0]["node"] == run.settings.node


def test_nan_is_sent_not_dropped(make_run, transport):
    run = make_run()
    run.log({"loss": float("nan")}, step=4512)
    run.flush(2.0)
    values = {p["name"]: p["value"] for p in transport.points()}
    assert values == {"loss": "NaN", "nonfinite.loss": 1.0}


def test_log_is_fast_and_never_blocks_on_a_dead_console(make_run, transport):
    transport.down = True
    run = make_run()
    started = time.perf_counter()
    for step in range(20_000):
        run.log({"loss": 0.5}, step=step)
    per_call = (time.perf_counter() - started) / 20_000
    assert per_call < 100e-6, f"run.log took {per_call * 1e6:.1f} us per call"


def test_outage_spills_to_disk_and_replays_everything_in_order(make_run, transport):
    transport.down = True
    run = make_run(batch_points=50, max_memory_points=200)
    for step in range(3000):
        run.log({"loss": float(step)}, step=step)
        assert run.sender.spool.memory_points <= 200
    wait_until(lambda: run.sender.spool.spilled_points > 0 and not run.sender._queue)
    assert list(run.sender.spool.directory.glob("*.jsonl"))
    transport.calls.clear()
    transport.down = False
    assert run.flush(10.0)
    losses = [p["step"] for p in transport.points() if p["name"] == "loss"]
    assert losses == list(range(3000))  # nothing lost, nothing duplicated, in order
    assert not list(run.sender.spool.directory.glob("*.jsonl"))


def test_429_waits_at_least_retry_after(make_run, transport):
    answers = [Response(429, {"error": "rate_limited"}, retry_after=0.3)]

    def responder(path, body):
        if path == "metrics" and answers:
            return answers.pop()
        return None

    transport.responder = responder
    run = make_run(flush_interval=0.01)
    run.log({"loss": 1.0}, step=1)
    wait_until(lambda: len(transport.bodies("metrics")) >= 2)
    times = [when for when, path, _ in transport.calls if path == "metrics"]
    assert times[1] - times[0] >= 0.3
    first, second = transport.bodies("metrics")[:2]
    assert first == second  # the same batch, retried


def test_400_drops_the_batch_with_a_counted_warning(make_run, transport, caplog):
    transport.responder = lambda path, body: (
        Response(400, {"error": "invalid", "detail": "bad point"}) if path == "metrics" else None
    )
    run = make_run()
    with caplog.at_level(logging.WARNING, logger="brakeline"):
        run.log({"loss": 1.0, "acc": 0.5}, step=1)
        run.flush(2.0)
    assert run.sender.spool.dropped == 3
    assert "dropped 3 metric points" in caplog.text
    assert len(transport.bodies("metrics")) == 1  # not retried


def test_413_halves_the_batches_and_delivers_everything(make_run, transport):
    def responder(path, body):
        if path == "metrics" and len(body["points"]) > 30:
            return Response(413, {"error": "too_large"})
        return None

    transport.responder = responder
    run = make_run(batch_points=200, flush_interval=10.0)
    for step in range(100):
        run.log({"loss": 0.1}, step=step)
    assert run.flush(5.0)
    accepted = [b for b in transport.bodies("metrics") if len(b["points"]) <= 30]
    assert sum(len(b["points"]) for b in accepted) == 200
    assert run.sender.spool.dropped == 0


def test_401_is_logged_loudly_once_and_points_are_kept(make_run, transport, caplog):
    transport.responder = lambda path, body: Response(401, {"error": "unauthorized"})
    run = make_run()
    with caplog.at_level(logging.ERROR, logger="brakeline"):
        for step in range(5):
            run.log({"loss": 1.0}, step=step)
            time.sleep(0.03)
        wait_until(lambda: len(transport.bodies("metrics")) >= 3)
    loud = [
        r
        for r in caplog.records
        if "REJECTED THE AGENT TOKEN" in r.getMessage()
        and r.name == "brakeline"
        and "metrics" in r.getMessage()
    ]
    assert len(loud) == 1
    assert run.sender.spool.pending_points == 10


def test_commands_in_metrics_replies_reach_the_inbox_once(make_run, transport):
    transport.commands = [{"id": 17, "kind": "lower_lr", "params": {"factor": 0.5}}]
    run = make_run()
    run.log({"loss": 1.0}, step=1)
    run.flush(2.0)
    wait_until(lambda: len(transport.bodies("heartbeat")) >= 2)
    assert run.inbox.take().id == 17
    assert run.inbox.take() is None  # repeated in every reply, queued once


def test_finish_with_the_console_down_keeps_points_for_the_next_start(make_run, transport):
    transport.down = True
    run = make_run(finish_timeout=0.3)
    for step in range(10):
        run.log({"loss": 1.0}, step=step)
    run.finish()
    directory = run.sender.spool.directory
    assert sum(len(p.read_text().splitlines()) for p in directory.glob("*.jsonl")) == 20
    transport.down = False
    transport.calls.clear()
    successor = make_run()
    assert successor.sender.spool.directory == directory
    assert successor.flush(3.0)
    assert [p["step"] for p in transport.points() if p["name"] == "loss"] == list(range(10))


def test_an_unexpected_transport_error_is_logged_and_the_thread_goes_on(
    make_run, transport, caplog
):
    failures = [RuntimeError("bug in a proxy library")] * 2

    def responder(path, body):
        if path == "metrics" and failures:
            raise failures.pop()
        return None

    transport.responder = responder
    run = make_run()
    run.log({"loss": 1.0}, step=1)
    assert run.flush(5.0)
    assert "metrics thread error" in caplog.text
    assert run.sender._thread.is_alive()


def test_http_transport_reports_an_unreachable_console_as_transport_error():
    import pytest

    from brakeline._transport import HttpTransport, TransportError

    with pytest.raises(TransportError):
        HttpTransport("http://127.0.0.1:1", "token", timeout=2.0).post("heartbeat", b"{}")
    with pytest.raises(TransportError):
        HttpTransport("not a url", "token", timeout=2.0).post("heartbeat", b"{}")


def test_flush_waits_for_a_record_the_sender_thread_is_still_encoding(make_run, transport):
    # Found by the live integration test: a record taken off the queue but not yet in the
    # spool made the sender look idle, so finish() stopped it and the last step's points went
    # to the spill folder instead of the console.
    run = make_run(flush_interval=10.0)
    expand = run.sender._expander.expand

    def slow_expand(record):
        time.sleep(0.3)  # the window between popleft() and spool.add(), made wide
        return expand(record)

    run.sender._expander.expand = slow_expand
    run.log({"loss": 0.25}, step=150)
    run.sender._wake.set()
    time.sleep(0.05)  # the sender thread is inside expand() now
    assert run.flush(5.0)
    assert [p["step"] for p in transport.points() if p["name"] == "loss"] == [150]


def _poisoned(status: int):
    """Refuse (with ``status``) every batch holding the metric "poison"; accept the rest."""

    def responder(path, body):
        if path == "metrics" and any(p["name"] == "poison" for p in body["points"]):
            return Response(status, {"error": "invalid", "detail": f"refused with {status}"})
        return None

    return responder


@pytest.mark.parametrize("status", [400, 403, 404, 405, 409, 413, 415, 422])
def test_a_4xx_drops_the_batch_loudly_once_and_the_next_ones_go_on(
    make_run, transport, caplog, status
):
    transport.responder = _poisoned(status)
    run = make_run()
    with caplog.at_level(logging.ERROR, logger="brakeline"):
        run.log({"poison": 1.0}, step=1)
        wait_until(lambda: run.sender.refused_batches == 1)
        run.log({"loss": 2.0}, step=2)
        assert run.flush(5.0)
    loud = [
        r for r in caplog.records if r.levelno == logging.ERROR and "METRICS BATCH" in r.message
    ]
    assert len(loud) == 1 and f"refused with {status}" in loud[0].message
    assert f"HTTP {status}" in loud[0].message
    assert run.sender.refused_batches == 1 and run.sender.spool.dropped >= 1
    poisoned = [b for b in transport.bodies("metrics") if b["points"][0]["name"] == "poison"]
    assert len(poisoned) == 1  # never retried
    assert any(p["name"] == "loss" for p in transport.points())
    assert transport.bodies("metrics")[-1]["points"][0]["name"] != "poison"


@pytest.mark.parametrize("status", [408, 429])
def test_408_and_429_are_retried_not_dropped(make_run, transport, status):
    answers = [Response(status, {"error": "later"}), Response(status, {"error": "later"})]

    def responder(path, body):
        if path == "metrics" and answers:
            return answers.pop()
        return None

    transport.responder = responder
    run = make_run()
    run.log({"loss": 1.0}, step=1)
    assert run.flush(5.0)
    assert run.sender.refused_batches == 0 and run.sender.spool.dropped == 0
    bodies = transport.bodies("metrics")
    assert len(bodies) == 3 and bodies[0] == bodies[2]


def test_a_batch_the_console_keeps_failing_on_is_dropped_and_the_rest_go_on(
    make_run, transport, caplog
):
    from brakeline._sender import MAX_SERVER_ERRORS_PER_BATCH

    transport.responder = _poisoned(500)
    run = make_run()
    with caplog.at_level(logging.ERROR, logger="brakeline"):
        run.log({"poison": 1.0}, step=1)
        wait_until(lambda: run.sender.refused_batches == 1)
        run.log({"loss": 2.0}, step=2)
        assert run.flush(5.0)
    poisoned = [b for b in transport.bodies("metrics") if b["points"][0]["name"] == "poison"]
    assert len(poisoned) == MAX_SERVER_ERRORS_PER_BATCH
    assert "FAILED 5 TIMES ON A METRICS BATCH" in caplog.text
    assert any(p["name"] == "loss" for p in transport.points())


def test_an_outage_503_is_retried_without_limit(make_run, transport):
    transport.responder = _poisoned(503)
    run = make_run()
    run.log({"poison": 1.0}, step=1)
    wait_until(lambda: len(transport.bodies("metrics")) >= 8)
    assert run.sender.refused_batches == 0 and run.sender.spool.dropped == 0


def test_a_run_the_console_refuses_is_said_loudly_once(make_run, transport, caplog):
    """A finished job's token reused for a new run: the console answers its heartbeats 409
    (it will not brake this run) and the SDK says so once, with the console's sentence."""
    detail = "Job 'x' is finished: a new run needs a job of its own"

    def responder(path, body):
        return (
            Response(409, {"error": "job_over", "detail": detail}) if path == "heartbeat" else None
        )

    transport.responder = responder
    run = make_run()
    steps = iter(range(1_000_000))

    def trained_a_step_and_beat_thrice() -> bool:
        step = next(steps)  # progress between beats: a run without any is not heartbeated
        run.log({"loss": 1.0}, step=step)
        run.step_boundary(step)
        return len(transport.bodies("heartbeat")) >= 3

    with caplog.at_level(logging.ERROR, logger="brakeline"):
        wait_until(trained_a_step_and_beat_thrice)
    loud = [r for r in caplog.records if "REFUSED THIS RUN (409)" in r.getMessage()]
    assert len(loud) == 1 and detail in loud[0].getMessage()
