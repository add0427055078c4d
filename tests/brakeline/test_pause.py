"""The pause controller: one state machine behind pause_data, checkpoint_and_pause and the
framework saves (the framework callbacks themselves are tested in test_integration_*)."""

import pytest

import brakeline
from brakeline import PauseState


def _file_saver(path, step):
    path.write_bytes(b"weights at step %d" % step)


def _record_states(run, seen):
    """Record the state at each observable point: release, a command inside the hold, resume."""
    run.on_release(lambda info: seen.append(("release", run.pause_state)))
    run.on_resume(lambda info: seen.append(("resume", run.pause_state)))
    run.on_command(
        "isolate_node", lambda r, c, s: seen.append(("in hold", r.pause_state, r.status)) or {}
    )


def test_checkpoint_and_pause_goes_saving_confirming_released_held_running(make_run):
    run = make_run()
    run.set_saver(_file_saver)
    seen = []
    _record_states(run, seen)
    assert run.pause_state is PauseState.RUNNING
    for payload in (
        {"id": 1, "kind": "checkpoint_and_pause"},
        {"id": 2, "kind": "isolate_node"},
        {"id": 3, "kind": "resume"},
    ):
        run.inbox.offer(payload)
    run.step_boundary(3)
    assert seen == [
        ("release", PauseState.RELEASED),
        ("in hold", PauseState.HELD, "paused"),
        ("resume", PauseState.RUNNING),
    ]
    assert run.pause_state is PauseState.RUNNING and run.status == "running"
    assert not run.paused


def test_a_failed_save_goes_from_saving_straight_to_the_hold(make_run):
    run = make_run()

    def broken(path, step):
        raise OSError(28, "No space left on device")

    run.set_saver(broken)
    seen = []
    _record_states(run, seen)
    for payload in (
        {"id": 1, "kind": "checkpoint_and_pause"},
        {"id": 2, "kind": "isolate_node"},
        {"id": 3, "kind": "resume"},
    ):
        run.inbox.offer(payload)
    run.step_boundary(3)
    assert seen == [("in hold", PauseState.HELD, "paused"), ("resume", PauseState.RUNNING)]
    assert [ack["status"] for ack in run.acknowledgements] == ["failed", "succeeded", "succeeded"]


def test_a_pause_command_inside_a_hold_does_not_nest_a_second_hold(make_run):
    run = make_run()
    run.set_saver(_file_saver)
    for payload in (
        {"id": 1, "kind": "checkpoint_and_pause"},
        {"id": 2, "kind": "pause_data"},
        {"id": 3, "kind": "resume"},  # one resume ends the whole pause
    ):
        run.inbox.offer(payload)
    run.step_boundary(8)
    acks = {ack["id"]: ack for ack in run.acknowledgements}
    assert acks[2]["result"]["already_paused"] is True
    # The pause in progress reports its own checkpoint.
    assert acks[2]["result"]["sha256"] == acks[1]["result"]["sha256"]
    assert acks[3]["status"] == "succeeded"
    assert run.pause_state is PauseState.RUNNING


def test_after_a_graceful_terminate_no_pause_starts(make_run):
    run = make_run()
    run.set_saver(_file_saver)
    stopped = []
    run.set_terminate_handler(stopped.append)  # a framework stopping at its own pace
    run.inbox.offer({"id": 1, "kind": "terminate"})
    run.inbox.offer({"id": 2, "kind": "checkpoint_and_pause"})
    run.step_boundary(5)
    assert stopped == [5]
    assert run.pause_state is PauseState.STOPPED
    ack = {ack["id"]: ack for ack in run.acknowledgements}[2]
    assert ack["status"] == "failed" and "stopping" in ack["error"]


def test_a_deferred_save_keeps_the_commands_behind_it_for_its_hold(make_run):
    """What a framework that saves in a later hook (the HF Trainer's on_save) relies on."""
    run = make_run()
    pause = run._pause

    def request(r, c, step):
        pause.request_save(c, step)
        return brakeline.ACK_LATER

    run.on_command("checkpoint_and_pause", request)
    run.inbox.offer({"id": 1, "kind": "checkpoint_and_pause"})
    run.inbox.offer({"id": 2, "kind": "resume"})
    run.step_boundary(2)
    assert run.pause_state is PauseState.SAVE_REQUESTED and run.status == "checkpointing"
    assert run.acknowledgements == [] and run.inbox.has_pending  # the resume waits
    result = brakeline.CheckpointResult(path="/ckpt", bytes=1, seconds=0.1, sha256="ab", step=2)
    pause.checkpoint_and_pause(pause.save_request.command, 2, lambda: result)
    assert [(ack["id"], ack["status"]) for ack in run.acknowledgements] == [
        (1, "succeeded"),
        (2, "succeeded"),
    ]
    assert run.pause_state is PauseState.RUNNING


def test_an_out_of_order_transition_is_a_bug_not_a_silent_state(make_run):
    run = make_run()
    with pytest.raises(RuntimeError, match="RUNNING -> RELEASED"):
        run._pause._enter(PauseState.RELEASED)
    assert run.pause_state is PauseState.RUNNING
