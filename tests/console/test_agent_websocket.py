"""/ws/agent/: commands reach the agent over a real websocket through Daphne and Redis."""

from __future__ import annotations

import json

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from breakers.agent.service import heartbeat_reply
from breakers.control.commands import issue_command
from breakers.models import Command, CommandStatus

pytestmark = pytest.mark.django_db(transaction=True)


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/ws/agent/"


def next_message(socket, timeout: float = 10.0) -> dict:
    return json.loads(socket.recv(timeout=timeout))


def test_a_command_is_pushed_the_moment_it_is_committed(live_console, agent):
    with connect(ws_url(live_console), additional_headers=agent.headers) as socket:
        issued = issue_command(
            agent.job_id, "checkpoint_and_pause", reason="loss is NaN at step 9", severity="L3"
        ).command
        message = next_message(socket)
    assert message["type"] == "command"
    assert message["command"]["id"] == issued.pk
    assert message["command"]["kind"] == "checkpoint_and_pause"
    assert message["command"]["reason"] == "loss is NaN at step 9"


def test_token_in_the_query_string_and_catch_up_on_connect(live_console, agent):
    issued = issue_command(agent.job_id, "lower_lr", reason="L2", params={"factor": 0.5}).command
    with connect(ws_url(live_console) + f"?token={agent.token}") as socket:
        message = next_message(socket)
    assert message["command"]["id"] == issued.pk
    assert Command.objects.get(pk=issued.pk).status == CommandStatus.DELIVERED


def test_acknowledging_over_the_websocket(live_console, agent):
    issued = issue_command(agent.job_id, "terminate", reason="XID").command
    with connect(ws_url(live_console), additional_headers=agent.headers) as socket:
        next_message(socket)
        socket.send(json.dumps({"type": "ack", "id": issued.pk, "status": "succeeded"}))
        assert next_message(socket) == {"type": "acked", "id": issued.pk, "status": "succeeded"}
        socket.send(json.dumps({"type": "ack", "id": issued.pk + 999, "status": "succeeded"}))
        assert next_message(socket)["error"] == "not_found"


def test_other_jobs_commands_do_not_reach_this_agent(live_console, make_agent):
    mine, other = make_agent(name="mine"), make_agent(name="other")
    with connect(ws_url(live_console), additional_headers=mine.headers) as socket:
        issue_command(other.job_id, "terminate", reason="not yours")
        issued = issue_command(mine.job_id, "lower_lr", reason="yours").command
        message = next_message(socket)
    assert message["command"]["id"] == issued.pk


@pytest.mark.parametrize("token", ["bkl_unknown", ""])
def test_an_unknown_or_missing_token_is_refused(live_console, agent, token):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(live_console), additional_headers=headers)
    assert refused.value.response.status_code == 403


def test_an_idle_websocket_survives_longer_than_the_redis_read_timeout(live_console, agent):
    """redis-py 8's 5 s default read timeout used to kill idle consumers with 1011."""
    import time

    with connect(ws_url(live_console), additional_headers=agent.headers) as socket:
        time.sleep(7)
        issued = issue_command(agent.job_id, "lower_lr", reason="after a quiet spell").command
        assert next_message(socket)["command"]["id"] == issued.pk


def catch_up(socket) -> list[int]:
    """The ids a fresh socket's catch-up sent: everything before the answer to a junk message
    (the consumer sends its catch-up before it reads anything)."""
    socket.send(json.dumps({"type": "hello"}))
    ids = []
    while (message := next_message(socket))["type"] == "command":
        ids.append(message["command"]["id"])
    assert message["type"] == "error"
    return ids


def test_a_rank_s_catch_up_leaves_out_the_commands_it_acked(live_console, agent):
    for rank in (0, 1):
        body = {"step": 100, "status": "running", "rank": rank, "world_size": 2, "pid": 10 + rank}
        heartbeat_reply(agent.job_id, json.dumps(body).encode())
    lower = issue_command(agent.job_id, "lower_lr", reason="L2", params={"factor": 0.5})
    pause = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN", severity="L3")
    both = [lower.command.pk, pause.command.pk]
    url = ws_url(live_console) + f"?token={agent.token}"
    with connect(url + "&rank=0") as socket:
        assert catch_up(socket) == both
        step = pause.command.apply_at_step
        ack = {
            "type": "ack",
            "id": pause.command.pk,
            "status": "succeeded",
            "result": {"rank": 0, "step": step},
        }
        socket.send(json.dumps(ack))
        answer = next_message(socket)
        assert answer == {"type": "acked", "id": pause.command.pk, "status": "delivered"}
    # Rank 0 reconnects: the pause it applied is not sent again; rank 1 has acked nothing.
    with connect(url + "&rank=0") as socket:
        assert catch_up(socket) == [lower.command.pk]
    with connect(url + "&rank=1") as socket:
        assert catch_up(socket) == both
    with connect(url) as socket:  # no rank said (one process, an older SDK): every open one
        assert catch_up(socket) == both


@pytest.mark.parametrize(
    "query", ["rank=-1", "rank=one", "rank=", "rank=2147483648", "rank=1&rank=2", "rank=%D9%A3"]
)
def test_a_rank_that_is_not_one_is_refused_naming_the_field(live_console, agent, query):
    issue_command(agent.job_id, "lower_lr", reason="L2", params={"factor": 0.5})
    with connect(ws_url(live_console) + f"?token={agent.token}&{query}") as socket:
        message = next_message(socket)
        assert (message["type"], message["error"], list(message["fields"])) == (
            "error",
            "invalid",
            ["rank"],
        )
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=10)
    assert closed.value.rcvd.code == 4400


def test_a_nodes_catch_up_names_the_ranks_still_owing_each_command(live_console, agent):
    for rank in (0, 1, 2):
        body = {"step": 100, "status": "running", "rank": rank, "world_size": 3, "pid": 10 + rank}
        heartbeat_reply(agent.job_id, json.dumps(body).encode())
    lower = issue_command(agent.job_id, "lower_lr", reason="L2", params={"factor": 0.5}).command
    pause = issue_command(agent.job_id, "checkpoint_and_pause", reason="NaN", severity="L3")
    url = ws_url(live_console) + f"?token={agent.token}"
    with connect(url + "&rank=1") as socket:
        catch_up(socket)
        ack = {"type": "ack", "id": lower.pk, "status": "succeeded", "result": {"rank": 1}}
        socket.send(json.dumps(ack))
        assert next_message(socket)["type"] == "acked"
    with connect(url + "&ranks=0,1,2") as socket:
        first, second = next_message(socket), next_message(socket)
        assert (first["command"]["id"], first["ranks"]) == (lower.pk, [0, 2])
        assert (second["command"]["id"], second["ranks"]) == (pause.command.pk, [0, 1, 2])
        issued = issue_command(agent.job_id, "resume", reason="checked").command
        pushed = next_message(socket)  # a push after the catch-up: for every rank of the node
        assert pushed["command"]["id"] == issued.pk and "ranks" not in pushed


@pytest.mark.parametrize(
    "query", ["ranks=", "ranks=1,,2", "ranks=-1", "ranks=2147483648", "ranks=1&ranks=2"]
)
def test_a_nodes_ranks_that_are_not_ranks_are_refused_naming_the_field(live_console, agent, query):
    with connect(ws_url(live_console) + f"?token={agent.token}&{query}") as socket:
        message = next_message(socket)
        assert (message["type"], list(message["fields"])) == ("error", ["ranks"])
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=10)
    assert closed.value.rcvd.code == 4400
