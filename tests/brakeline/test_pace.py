"""A rank's step clock (no torch, a hand-turned clock): its own compute time per step, the
wait in the gradient sync left out; the sync it entered; warm-up after a start or a hold."""

from __future__ import annotations

import pytest

from brakeline._pace import WARMUP_STEPS, StepPace


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pace():
    clock = Clock()
    state = {"step": 0}
    found = StepPace(lambda: state["step"] + 1, clock)
    return found, clock, state


def step(pace, clock, state, work, wait, buckets=2):
    """One hooked step: ``work`` seconds of its own, then ``wait`` in the all-reduce."""
    found = pace
    clock.now += work / 2
    for index in range(buckets):  # buckets get ready during backward; the last one at ``work``
        if index == buckets - 1:
            clock.now += work / 2
        found.bucket_ready(index == buckets - 1)
    clock.now += wait
    found.step_ended()
    state["step"] += 1
    found.step_started()


def test_the_wait_for_the_other_ranks_is_not_compute(pace):
    found, clock, state = pace
    found.step_started()
    for _ in range(WARMUP_STEPS):  # warm-up: not counted
        step(found, clock, state, work=5.0, wait=0.0)
    assert "compute_seconds" not in found.heartbeat_fields()
    for _ in range(4):
        step(found, clock, state, work=0.010, wait=0.090)  # a fast rank waits for a slow one
    fields = found.heartbeat_fields()
    assert fields["compute_seconds"] == pytest.approx(0.010)
    assert fields["sync_step"] == state["step"]  # the last sync it entered
    assert "compute_seconds" not in found.heartbeat_fields()  # each heartbeat: its own steps


def test_a_rank_blocked_in_the_next_sync_says_so_once(pace):
    found, clock, state = pace
    found.step_started()
    step(found, clock, state, work=0.01, wait=0.0)
    entered = found.entered
    found.bucket_ready(False)  # step 2's first bucket: it waits in step 2's all-reduce
    assert found.entered == entered + 1 and found.sync_step == 2 and state["step"] == 1
    found.bucket_ready(True)
    assert found.entered == entered + 1  # one sync per step, however many buckets


def test_without_a_hooked_sync_the_step_runs_boundary_to_boundary(pace):
    found, clock, state = pace
    found.step_started()
    for _ in range(WARMUP_STEPS + 3):
        clock.now += 0.25
        found.step_ended()
        clock.now += 7.0  # what the boundary did (a command, a save): not the next step's work
        found.step_started()
    assert found.heartbeat_fields() == {"compute_seconds": pytest.approx(0.25)}


def test_a_hold_or_a_save_is_not_measured_and_a_hold_warms_up_again(pace):
    found, clock, state = pace
    found.step_started()
    for _ in range(WARMUP_STEPS + 2):
        step(found, clock, state, work=0.02, wait=0.0)
    found.heartbeat_fields()
    clock.now += 0.01
    found.skip_step()  # a checkpoint inside the step
    clock.now += 30.0
    found.step_ended()
    found.step_started()
    assert "compute_seconds" not in found.heartbeat_fields()
    found.restart()  # a pause held at the boundary, then resumed
    found.step_started()  # the end of that boundary
    for _ in range(WARMUP_STEPS):
        step(found, clock, state, work=3.0, wait=0.0)  # slow after the resume: warm-up
    step(found, clock, state, work=0.02, wait=0.0)
    assert found.heartbeat_fields()["compute_seconds"] == pytest.approx(0.02)


def test_only_a_ddp_model_gets_the_hook(pace):
    """FSDP (and others) have a register_comm_hook of another signature: left alone."""
    found, _, _ = pace
    called = []

    class OtherWrapper:
        def register_comm_hook(self, state, hook):
            called.append(hook)

    assert found.hook(OtherWrapper()) is False and called == [] and not found.hooked
