"""The run's state and the heartbeats built from it, on their own (no run, no threads): a
heartbeat needs progress once the loop steps, and an offline link queues nothing."""

from __future__ import annotations

from brakeline._encoding import LogRecord
from brakeline._link import ConsoleLink
from brakeline._pace import StepPace
from brakeline._settings import resolve_settings
from brakeline._state import HeartbeatBody, RunState

ENVIRON = {"WORLD_SIZE": "4", "SLURM_JOB_ID": "77"}


def heartbeats(rank: int = 1, environ: dict[str, str] | None = None, **settings):
    resolved = resolve_settings({"job": "j", "url": "", "token": "", "rank": rank, **settings})
    state = RunState()
    pace = StepPace(state.next_step)
    return (
        state,
        pace,
        HeartbeatBody(resolved, state, pace, ENVIRON if environ is None else environ),
    )


def test_a_heartbeat_says_the_runs_step_status_rank_and_world_size():
    state, _, body = heartbeats()
    state.step, state.status = 12, "paused"
    beat = body()
    assert beat is not None
    assert (beat["step"], beat["status"], beat["rank"], beat["world_size"]) == (12, "paused", 1, 4)
    assert body.multi_rank


def test_a_stepping_loop_without_progress_sends_no_running_heartbeat():
    state, _, body = heartbeats()
    state.stepping = True
    assert body() is not None
    assert body() is None  # nothing moved since: a hung loop turns into a heartbeat timeout
    state.keepalive()
    assert body() is not None
    state.status = "paused"
    assert body() is not None  # a held run heartbeats without progress


def test_entering_a_gradient_sync_is_news_for_one_heartbeat():
    state, pace, body = heartbeats()
    state.stepping = True
    body()
    pace.bucket_ready(True)  # a rank blocked in the all-reduce says so before it goes silent
    assert body() is not None
    assert body() is None


def test_before_the_first_step_a_heartbeat_needs_no_progress():
    _, _, body = heartbeats()
    assert body() is not None and body() is not None


def test_rank_zero_of_one_is_a_single_process():
    _, _, body = heartbeats(rank=0, environ={})
    beat = body()
    assert beat is not None and "world_size" not in beat
    assert not body.multi_rank


def test_an_offline_link_queues_nothing_and_waits_for_nothing():
    link = ConsoleLink()
    link.start()
    assert not link.online
    assert link.submit(LogRecord(step=1, time=0.0, metrics={"loss": 1.0})) is False
    link.enqueue("ack:1", "commands/1/ack", b"{}")
    link.queue_snapshot("start", 0, lambda: b"{}")
    assert link.flush(1.0) is True  # nothing pending
    assert link.say_status("holding", 1.0) is False
    assert link.wait_delivered("ack:1", 1.0) is False
    link.stop(1.0)
