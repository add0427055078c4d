"""The node's forwarder on a real unix socket, its console a recorder: a node's ranks' requests
leave as one bundle and each rank gets its own part's answer; a console without bundles gets
them one by one; a forwarder that stopped or never started costs only the saving (each rank
posts directly); the node's websocket reaches the ranks it names. The real console and torchrun:
tests/brakeline/test_integration_live_node.py."""

from __future__ import annotations

import json
import threading

import pytest

from brakeline import _node as node
from brakeline._commands import CommandInbox
from brakeline._forwarder import NodeForwarder
from brakeline._node import NodeSubscription, NodeTransport, node_plan
from brakeline._settings import resolve_settings
from brakeline._transport import Response, TransportError


class Console:
    """Answers bundles part by part (or 404, like a console before protocol 4)."""

    def __init__(self, bundles: bool = True) -> None:
        self.bundles = bundles
        self.posts: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()
        self.timeout = 1.0

    def post(self, path: str, body: bytes) -> Response:
        with self.lock:
            self.posts.append((path, body))
        if path != "bundle":
            return Response(202, {"own": json.loads(body)["rank"]}, protocol=4)
        if not self.bundles:
            return Response(404, {"error": "not_found"})
        parts = json.loads(body)["parts"]
        results = [{"status": 202, "body": {"part": json.loads(p["body"])["rank"]}} for p in parts]
        return Response(200, {"results": results}, protocol=4)

    def paths(self) -> list[str]:
        return [path for path, _ in self.posts]


class Unreachable:
    timeout = 1.0

    def post(self, path: str, body: bytes) -> Response:
        raise TransportError("refused")


@pytest.fixture
def socket_path(tmp_path):
    return str(tmp_path / "node.sock")


def post_from_every_rank(transports) -> list[Response]:
    answers: list[Response | None] = [None] * len(transports)

    def post(index: int) -> None:
        body = json.dumps({"rank": index, "points": []}).encode()
        answers[index] = transports[index].post("metrics", body)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(transports))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return answers  # type: ignore[return-value]


def test_the_nodes_ranks_leave_as_one_bundle_and_each_gets_its_own_answer(socket_path):
    console, direct = Console(), Console()
    forwarder = NodeForwarder(console, socket_path, local_ranks=4, window=5.0)
    assert forwarder.start()
    try:
        transports = [NodeTransport(socket_path, rank, direct, 5.0) for rank in range(4)]
        answers = post_from_every_rank(transports)
    finally:
        forwarder.stop()
    # Sent when the fourth rank's request arrived, well before the 5 s window.
    assert console.paths() == ["bundle"] and not direct.posts
    assert [(a.status, a.body, a.protocol) for a in answers] == [
        (202, {"part": rank}, 4) for rank in range(4)
    ]


def test_a_console_without_bundles_gets_the_parts_one_by_one(socket_path):
    console = Console(bundles=False)
    forwarder = NodeForwarder(console, socket_path, local_ranks=2, window=5.0)
    forwarder.start()
    try:
        transports = [NodeTransport(socket_path, rank, Console(), 5.0) for rank in range(2)]
        answers = post_from_every_rank(transports)
        post_from_every_rank(transports)
    finally:
        forwarder.stop()
    assert sorted(a.body["own"] for a in answers) == [0, 1]
    # Asked once; from then on the parts go on their own.
    assert console.paths() == ["bundle", "metrics", "metrics", "metrics", "metrics"]


def test_a_console_out_of_reach_is_a_transport_error_for_each_rank(socket_path):
    forwarder = NodeForwarder(Unreachable(), socket_path, local_ranks=1, window=0.1)
    forwarder.start()
    direct = Console()
    try:
        with pytest.raises(TransportError):
            NodeTransport(socket_path, 0, direct, 0.1).post("heartbeat", b'{"rank":0}')
    finally:
        forwarder.stop()
    assert not direct.posts  # the console is away: the rank's own retries, not a detour


def test_without_its_forwarder_a_rank_posts_directly_and_finds_it_again(socket_path):
    direct, console = Console(), Console()
    transport = NodeTransport(socket_path, 3, direct, 0.1)
    body = b'{"rank":3,"points":[]}'
    assert transport.post("metrics", body).body == {"own": 3}  # none started yet
    forwarder = NodeForwarder(console, socket_path, local_ranks=1, window=0.1)
    forwarder.start()
    transport._local_again_at = 0.0  # the two seconds before it tries the forwarder again
    assert transport.post("metrics", body).body == {"own": 3}  # one part: sent on its own
    forwarder.stop()
    transport._local_again_at = 0.0
    assert transport.post("metrics", body).body == {"own": 3}
    assert (len(direct.posts), transport.through_node, transport.direct_posts) == (2, 1, 2)
    assert console.paths() == ["metrics"]


def test_snapshots_never_go_through_the_forwarder(socket_path):
    direct = Console()
    NodeTransport(socket_path, 0, direct, 0.1).post("snapshots", b'{"rank":0}')
    assert direct.paths() == ["snapshots"]


def test_the_nodes_websocket_reaches_the_ranks_it_names(socket_path):
    forwarder = NodeForwarder(Console(), socket_path, local_ranks=2, window=0.1)
    forwarder.start()
    inboxes = [CommandInbox(), CommandInbox()]
    subscriptions = [
        NodeSubscription(socket_path, rank, inboxes[rank], fallback=lambda: None)
        for rank in range(2)
    ]
    try:
        for subscription in subscriptions:
            subscription.start()
            assert subscription.connected.wait(5)
        while sum(len(c) for c in forwarder._subscribers.values()) < 2:
            threading.Event().wait(0.01)
        forwarder.deliver({"id": 7, "kind": "lower_lr"}, [1])  # a catch-up: rank 1 owes it
        forwarder.deliver({"id": 8, "kind": "checkpoint_and_pause"}, None)  # a push: all
        assert inboxes[1].wait_for(7, 5) and inboxes[0].wait_for(8, 5)
        assert inboxes[1].wait_for(8, 5)
    finally:
        for subscription in subscriptions:
            subscription.stop()
        forwarder.stop()
    assert not inboxes[0].knows(7)


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "RANK": "5"}, (1, (4, 5, 6, 7))),
        ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "RANK": "0"}, None),  # one rank
        ({"RANK": "3", "WORLD_SIZE": "4"}, None),  # the launcher says nothing of nodes
        ({"LOCAL_RANK": "x", "LOCAL_WORLD_SIZE": "2", "RANK": "1"}, None),
        ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2", "RANK": "3"}, None),
    ],
)
def test_the_node_plan_follows_the_launcher(tmp_path, environ, expected):
    overrides = {"url": "http://console", "token": "bkl_x", "node_dir": str(tmp_path)}
    settings = resolve_settings(overrides, environ)
    plan = node_plan(settings, environ)
    assert (None if plan is None else (plan.local_rank, plan.node_ranks)) == expected


def test_two_nodes_on_one_machine_have_two_sockets_and_off_is_off(tmp_path):
    overrides = {"url": "http://console", "token": "bkl_x", "node_dir": str(tmp_path)}
    first = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "RANK": "1"}
    second = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "RANK": "3"}
    plans = [node_plan(resolve_settings(overrides, env), env) for env in (first, second)]
    assert plans[0].socket_path != plans[1].socket_path  # type: ignore[union-attr]
    off = resolve_settings(overrides | {"node_forwarding": "off"}, first)
    assert node_plan(off, first) is None


def test_acknowledgements_leave_together_without_waiting_for_the_window(socket_path):
    console = Console()
    # A node of 4 whose two ranks acknowledge: sent once both are in (URGENT_WAIT), not
    # after the minute's window nor the other two ranks.
    forwarder = NodeForwarder(console, socket_path, local_ranks=4, window=60.0)
    forwarder.start()
    transports = [NodeTransport(socket_path, rank, Console(), 60.0) for rank in range(2)]
    threads = [
        threading.Thread(target=t.post, args=("commands/7/ack", b'{"rank":%d}' % t.rank))
        for t in transports
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        forwarder.stop()
    assert not any(thread.is_alive() for thread in threads)
    # One bundle of both, or (a loaded machine starting the second thread late) each alone.
    assert console.paths() in (["bundle"], ["commands/7/ack"] * 2)


def test_a_subscription_lost_for_good_opens_the_ranks_own_websocket(socket_path, monkeypatch):
    monkeypatch.setattr(node, "SUBSCRIPTION_GRACE_SECONDS", 0.3)
    forwarder = NodeForwarder(Console(), socket_path, local_ranks=1, window=0.1)
    forwarder.start()
    opened = threading.Event()

    class OwnWebsocket:
        def start(self) -> None:
            opened.set()

        def stop(self, timeout: float = 0) -> None:
            pass

    subscription = NodeSubscription(socket_path, 0, CommandInbox(), fallback=OwnWebsocket)
    subscription.start()
    try:
        assert subscription.connected.wait(5)
        forwarder.stop()
        assert opened.wait(10)
    finally:
        subscription.stop()
