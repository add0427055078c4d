"""Heartbeats, acknowledgements and snapshots delivered by the control thread."""

import os
import socket
import time

from brakeline._transport import Response
from tests.brakeline.conftest import wait_until


def test_heartbeat_carries_step_status_pid_hostname_rank(make_run, transport):
    run = make_run(rank=3)
    run.step_boundary(120)
    heartbeat = wait_until(lambda: [b for b in transport.bodies("heartbeat") if b["step"] == 120])
    assert heartbeat[0] == {
        "step": 120,
        "status": "running",
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "rank": 3,
    }


def test_heartbeats_stop_when_training_stops_making_progress(make_run, transport):
    run = make_run(heartbeat_interval=0.02)
    run.step_boundary(1)
    wait_until(lambda: transport.bodies("heartbeat"))
    time.sleep(0.1)  # let a heartbeat with step 1 go out
    before = len(transport.bodies("heartbeat"))
    time.sleep(0.3)  # a hung training loop: no step boundary
    assert len(transport.bodies("heartbeat")) <= before + 1
    run.step_boundary(2)
    wait_until(lambda: transport.bodies("heartbeat")[-1]["step"] == 2)
    run.keepalive()  # evaluation loops count as progress
    wait_until(lambda: len(transport.bodies("heartbeat")) >= before + 2)


def test_paused_runs_keep_heartbeating(make_run, transport):
    run = make_run(heartbeat_interval=0.02)
    run.step_boundary(1)
    run.set_status("paused")
    count = len(transport.bodies("heartbeat"))
    wait_until(lambda: len(transport.bodies("heartbeat")) >= count + 5)
    assert transport.bodies("heartbeat")[-1]["status"] == "paused"


def test_acks_are_retried_until_the_console_takes_them(make_run, transport):
    failures = [Response(503, {}), Response(503, {})]

    def responder(path, body):
        if path.startswith("commands/") and failures:
            return failures.pop()
        return None

    transport.responder = responder
    run = make_run()
    run.ack(17, "succeeded", {"step": 4})
    assert run.wait_for_ack(17)
    acks = [(path, body) for _, path, body in transport.calls if path.startswith("commands/")]
    assert len(acks) == 3
    assert acks[-1] == ("commands/17/ack", {"status": "succeeded", "result": {"step": 4}})


def test_an_ack_the_console_refuses_for_good_is_not_retried(make_run, transport):
    transport.responder = lambda path, body: (
        Response(404, {"error": "not_found"}) if path.startswith("commands/") else None
    )
    run = make_run()
    run.ack(99, "failed", {}, "no such thing")
    run.wait_for_ack(99)
    time.sleep(0.1)
    assert len([c for c in transport.calls if c[1] == "commands/99/ack"]) == 1


def test_start_snapshot_is_sent_in_the_background(make_run, transport, monkeypatch):
    monkeypatch.setenv("BRAKELINE_TEST_API_TOKEN", "abc")
    run = make_run(seeds={"global": 1234}, send_snapshots=True)
    body = wait_until(lambda: transport.bodies("snapshots"))[0]
    assert body["kind"] == "start" and body["step"] == 0
    snapshot = body["snapshot"]
    assert snapshot["seeds"] == {"global": 1234}
    assert snapshot["environment"]["BRAKELINE_TEST_API_TOKEN"] == "<redacted>"
    assert "pytest" in {name.lower() for name in snapshot["packages"]}
    assert snapshot["scheduler"]["rank"] == run.settings.rank


def test_finish_sends_a_final_finished_heartbeat(make_run, transport):
    run = make_run(heartbeat_interval=10.0)
    run.step_boundary(7)
    run.finish()
    assert transport.bodies("heartbeat")[-1]["status"] == "finished"
    assert transport.bodies("heartbeat")[-1]["step"] == 7
    run.log({"loss": 1.0})  # harmless after finish


def test_offline_run_works_without_a_console(tmp_path, exits):
    import brakeline

    run = brakeline.init("offline", url="", token="", spill_dir=str(tmp_path), exit_function=exits)
    run.log({"loss": 1.0}, step=1)
    run.step_boundary(1)
    run.inbox.offer({"id": 1, "kind": "resume"})
    run.step_boundary(2)
    assert run.acknowledgements[-1]["status"] == "succeeded"
    run.finish()


def test_settings_come_from_the_environment(monkeypatch):
    from brakeline._settings import resolve_settings

    monkeypatch.setenv("BRAKELINE_URL", "https://console.example/")
    monkeypatch.setenv("BRAKELINE_TOKEN", "tok")
    monkeypatch.setenv("BRAKELINE_HEARTBEAT_INTERVAL", "0.5")
    monkeypatch.setenv("RANK", "5")
    settings = resolve_settings({"token": "explicit"})
    assert settings.url == "https://console.example"
    assert settings.token == "explicit"
    assert settings.heartbeat_interval == 0.5
    assert settings.rank == 5
    assert settings.websocket_url == "wss://console.example/ws/agent/"


def test_an_idle_run_costs_almost_no_cpu(make_run):
    run = make_run(heartbeat_interval=0.05, flush_interval=0.05)
    run.step_boundary(1)
    time.sleep(0.1)
    started = time.process_time()
    time.sleep(0.4)
    assert time.process_time() - started < 0.1  # background threads sleep, never spin


def test_a_forked_child_never_finishes_the_parents_run(make_run, transport, monkeypatch):
    run = make_run()
    parent = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: parent + 1)
    run.finish()
    assert not run.finished and run.control._thread.is_alive()
    monkeypatch.setattr(os, "getpid", lambda: parent)
    run.finish()
    assert run.finished


def test_an_ack_the_console_keeps_failing_on_is_dropped_and_the_next_one_goes_on(
    make_run, transport, caplog
):
    import logging

    from brakeline._control import MAX_SERVER_ERRORS_PER_ITEM

    transport.responder = lambda path, body: (
        Response(500, {"error": "server_error"}) if path == "commands/13/ack" else None
    )
    run = make_run()
    with caplog.at_level(logging.ERROR, logger="brakeline"):
        run.ack(13, "succeeded", {"step": 1})
        run.ack(14, "succeeded", {"step": 2})
        assert run.wait_for_ack(14)
    assert len([c for c in transport.calls if c[1] == "commands/13/ack"]) == (
        MAX_SERVER_ERRORS_PER_ITEM
    )
    assert "THE CONSOLE REFUSED ack:13 (HTTP 500)" in caplog.text
