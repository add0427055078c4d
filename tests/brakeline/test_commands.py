"""Commands: de-duplication, application at the step boundary, pause/resume/terminate order.

Commands are injected through the SDK's own inbox (``run.inbox.offer``), the same entry the
websocket, heartbeat and metrics paths use.
"""

import threading
import time

import brakeline
from tests.brakeline.conftest import wait_until


def command(command_id, kind, **params):
    return {
        "id": command_id,
        "kind": kind,
        "params": params,
        "severity": "L3",
        "reason": "loss is NaN at step 4512",
        "issued_at": "2026-01-01T00:00:00Z",
    }


def acks_by_id(run):
    return {ack["id"]: ack for ack in run.acknowledgements}


def inject_later(run, payload, delay):
    timer = threading.Timer(delay, run.inbox.offer, args=(payload,))
    timer.start()
    return timer


def test_a_command_repeated_by_every_path_is_queued_once(make_run):
    run = make_run()
    assert run.inbox.offer(command(17, "resume")) is True
    assert run.inbox.offer(command(17, "resume")) is False
    assert run.inbox.offer({"id": "17", "kind": "resume"}) is False  # same id, other type
    assert run.inbox.offer({"kind": "resume"}) is False  # malformed: no id
    run.step_boundary(1)
    assert [ack["id"] for ack in run.acknowledgements] == [17]
    run.inbox.offer(command(17, "resume"))  # still in the next heartbeat reply
    run.step_boundary(2)
    assert len(run.acknowledgements) == 1


def test_commands_wait_for_the_step_boundary_and_run_in_the_training_thread(make_run):
    run = make_run()
    seen = []
    run.on_command(
        "isolate_node",
        lambda r, c, step: (
            seen.append((threading.current_thread(), step)) or {"isolated": c.params["node"]}
        ),
    )
    delivered = threading.Thread(
        target=run.inbox.offer, args=(command(5, "isolate_node", node="node-07"),)
    )
    delivered.start()
    delivered.join()
    assert seen == []  # a background delivery applies nothing
    run.step_boundary(42)
    assert seen == [(threading.main_thread(), 42)]
    assert acks_by_id(run)[5]["result"] == {"isolated": "node-07"}


def test_acks_reach_the_console(make_run, transport):
    run = make_run()
    run.inbox.offer(command(8, "resume"))
    run.step_boundary(3)
    assert run.wait_for_ack(8)
    assert (
        "commands/8/ack",
        {"status": "succeeded", "result": {"step": 3, "was_paused": False}},
    ) in [(path, body) for _, path, body in transport.calls]


def test_unknown_kind_is_acked_failed_with_a_clear_error(make_run):
    run = make_run()
    run.inbox.offer(command(9, "reboot_cluster"))
    run.step_boundary(1)
    ack = acks_by_id(run)[9]
    assert ack["status"] == "failed"
    assert "unknown command kind 'reboot_cluster'" in ack["error"]


def test_isolate_node_without_a_handler_is_not_applicable(make_run):
    run = make_run()
    run.inbox.offer(command(10, "isolate_node", node="node-03"))
    run.step_boundary(1)
    ack = acks_by_id(run)[10]
    assert ack["status"] == "failed" and "cannot take node-03 out of service" in ack["error"]


def test_a_handler_that_raises_is_acked_failed_and_training_goes_on(make_run):
    run = make_run()
    run.on_command("isolate_node", lambda r, c, s: 1 / 0)
    run.inbox.offer(command(11, "isolate_node"))
    run.step_boundary(1)
    assert "ZeroDivisionError" in acks_by_id(run)[11]["error"]
    run.step_boundary(2)


def test_lower_lr_without_an_optimizer_fails_clearly(make_run):
    run = make_run()
    run.inbox.offer(command(12, "lower_lr", factor=0.5))
    run.step_boundary(1)
    assert "no optimizer registered" in acks_by_id(run)[12]["error"]


def test_pause_data_blocks_the_wrapped_loader_until_resume(make_run, transport):
    run = make_run(heartbeat_interval=0.02)
    loader = run.wrap_loader(range(10))
    fetched = []
    timer = None
    for batch in loader:
        fetched.append((batch, time.monotonic()))
        if batch == 2:
            run.inbox.offer(command(20, "pause_data"))
            timer = inject_later(run, command(21, "resume"), 0.3)
        run.step_boundary(batch)
    timer.join()
    assert [batch for batch, _ in fetched] == list(range(10))
    assert fetched[3][1] - fetched[2][1] >= 0.3  # no batch while paused
    acks = acks_by_id(run)
    assert acks[20]["result"] == {"step": 2, "where": "data_loader"}
    assert acks[21]["status"] == "succeeded" and acks[21]["result"]["paused_seconds"] > 0.1
    assert "paused" in [body["status"] for body in transport.bodies("heartbeat")]
    assert run.status == "running"


def test_pause_data_without_a_wrapped_loader_holds_at_the_boundary(make_run):
    run = make_run()
    run.inbox.offer(command(22, "pause_data"))
    run.inbox.offer(command(23, "resume"))  # arrives in the same reply: must not be lost
    run.step_boundary(4)
    acks = acks_by_id(run)
    assert acks[22]["result"]["where"] == "step_boundary"
    assert acks[23]["status"] == "succeeded"


def _file_saver(path, step):
    path.write_bytes(b"weights at step %d" % step)


def _slow_file_saver(path, step):
    time.sleep(0.2)  # long enough for heartbeats to report "checkpointing"
    _file_saver(path, step)


def test_checkpoint_and_pause_saves_confirms_releases_then_holds(make_run, transport):
    run = make_run(send_snapshots=True)
    run.set_saver(_slow_file_saver, suffix=".bin")
    events = []
    run.on_release(
        lambda info: events.append(
            ("release", info.step, info.checkpoint.sha256, len(transport.bodies("commands/30/ack")))
        )
    )
    run.on_resume(lambda info: events.append(("resume", info.step)))
    resume = command(31, "resume")

    def resume_once_paused(path, body):
        # The console resumes the run once it has heard it is paused (held, not just saved).
        if path == "heartbeat" and body["status"] == "paused":
            run.inbox.offer(resume)

    transport.responder = resume_once_paused
    run.inbox.offer(command(30, "checkpoint_and_pause"))
    never_paused = inject_later(run, resume, 60.0)  # then the checks below say what is wrong
    run.step_boundary(4512)  # held until the resume
    never_paused.cancel()
    ack = acks_by_id(run)[30]
    assert ack["status"] == "succeeded"
    assert set(ack["result"]) == {"path", "bytes", "seconds", "sha256", "step", "reason"}
    assert ack["result"]["reason"] == "brake"  # why the checkpoint was taken (catalogue)
    assert ack["result"]["step"] == 4512 and ack["result"]["bytes"] == len(b"weights at step 4512")
    assert ack["result"]["path"].endswith("step-00004512.bin")
    # Released only after the acknowledgement reached the console, resumed after the resume ack.
    assert events == [("release", 4512, ack["result"]["sha256"], 1), ("resume", 4512)]
    assert acks_by_id(run)[31]["status"] == "succeeded"
    statuses = [body["status"] for body in transport.bodies("heartbeat")]
    assert "checkpointing" in statuses and "paused" in statuses
    snapshot = wait_until(
        lambda: [b for b in transport.bodies("snapshots") if b["kind"] == "checkpoint"]
    )[0]
    # The snapshot names the checkpoint it belongs to, with the hash the ack reported.
    assert snapshot["checkpoint"] == {
        "path": ack["result"]["path"],
        "sha256": ack["result"]["sha256"],
        "bytes": ack["result"]["bytes"],
    }
    assert snapshot["step"] == 4512


def test_a_failed_save_still_pauses_but_never_releases(make_run):
    run = make_run()

    def broken_saver(path, step):
        raise OSError(28, "No space left on device")

    run.set_saver(broken_saver)
    released = []
    run.on_release(released.append)
    run.inbox.offer(command(40, "checkpoint_and_pause"))
    run.inbox.offer(command(41, "resume"))
    run.step_boundary(10)
    ack = acks_by_id(run)[40]
    assert ack["status"] == "failed"
    assert "No space left" in ack["error"] and "paused" in ack["error"]
    assert released == []
    assert acks_by_id(run)[41]["status"] == "succeeded"


def test_commands_received_while_paused_are_applied_in_the_pause(make_run):
    run = make_run()
    run.set_saver(_file_saver)
    handled = []
    run.on_command("isolate_node", lambda r, c, s: handled.append(s) or {})
    for payload in (
        command(50, "checkpoint_and_pause"),
        command(51, "isolate_node"),
        command(52, "checkpoint_and_pause"),
        command(53, "resume"),
    ):
        run.inbox.offer(payload)
    run.step_boundary(7)
    acks = acks_by_id(run)
    assert handled == [7]
    assert acks[52]["result"]["already_paused"] is True
    assert [ack["id"] for ack in run.acknowledgements] == [50, 51, 52, 53]


def test_terminate_flushes_acks_finishes_and_exits_with_the_documented_code(
    make_run, transport, exits
):
    run = make_run(flush_interval=10.0)
    run.log({"loss": 3.0}, step=99)
    run.inbox.offer(command(60, "terminate"))
    run.step_boundary(99)
    assert exits.codes == [brakeline.EXIT_TERMINATED] == [75]
    assert run.finished and run.status == "finished"
    assert [p["step"] for p in transport.points() if p["name"] == "loss"] == [99]
    assert (
        "commands/60/ack",
        {"status": "succeeded", "result": {"step": 99, "exit_code": 75}},
    ) in [(path, body) for _, path, body in transport.calls]
    assert transport.bodies("heartbeat")[-1]["status"] == "finished"


def test_terminate_while_paused_exits_from_the_pause(make_run, exits):
    run = make_run()
    run.set_saver(_file_saver)
    run.inbox.offer(command(70, "checkpoint_and_pause"))
    inject_later(run, command(71, "terminate"), 0.1).join()
    run.step_boundary(5)
    assert exits.codes == [75]
    assert [ack["id"] for ack in run.acknowledgements] == [70, 71]


def test_default_exit_uses_sys_exit_in_the_main_thread():
    import pytest

    from brakeline._run import default_exit

    with pytest.raises(SystemExit) as raised:
        default_exit(brakeline.EXIT_TERMINATED)
    assert raised.value.code == 75


def test_the_run_is_a_context_manager(make_run, transport):
    with make_run() as run:
        run.log({"loss": 1.0}, step=1)
    assert run.finished
    assert [p["name"] for p in transport.points()] == ["loss", "nonfinite.loss"]
