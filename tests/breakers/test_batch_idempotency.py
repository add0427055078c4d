"""Protocol 2: a metrics batch with an id is stored once, however often and however it comes.

Over HTTP and over the agent websocket, one after the other (a lost answer, then the retry)
and at the same moment on two connections (a retry racing a first copy still in flight). One
Daphne process runs the sync views on one thread, so the race between two console processes is
also played out directly on two database connections, the first copy held uncommitted.
"""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from websockets.sync.client import connect

from breakers.models import MetricBatch
from breakers.storage.points import stored_points
from tests.support.waiting import wait_for

# Each test runs through the lean route and through the DRF views (tests/support/agent_doors.py).
BOTH_AGENT_DOORS = True

URL = "/api/v1/agent/metrics"


def batch(batch_id: str | None, start: int = 0, count: int = 3) -> dict:
    body: dict = {
        "points": [{"name": "loss", "step": s, "value": 1.0} for s in range(start, start + count)]
    }
    if batch_id is not None:
        body["batch"] = batch_id
    return body


def stored(job_id: int) -> int:
    return len(stored_points(job_id))


@pytest.mark.django_db
def test_a_retried_batch_is_stored_once_and_answered_alike(agent, agent_post):
    first = agent_post(URL, batch("run1-1"))
    retry = agent_post(URL, batch("run1-1"))
    assert first.status_code == retry.status_code == 202
    assert first.json() == retry.json() == {"accepted": 3, "commands": []}
    assert first["Brakeline-Protocol"] == "4"
    assert stored(agent.job_id) == 3
    assert MetricBatch.objects.get(job_id=agent.job_id).accepted == 3
    assert agent_post(URL, batch("run1-2", start=3)).json()["accepted"] == 3
    assert stored(agent.job_id) == 6


@pytest.mark.django_db
def test_without_a_batch_id_every_send_is_stored_as_in_protocol_1(agent, agent_post):
    agent_post(URL, batch(None))
    agent_post(URL, {**batch(None), "batch": None})
    assert stored(agent.job_id) == 6 and not MetricBatch.objects.exists()


@pytest.mark.django_db
def test_batch_ids_are_per_job(make_agent, client):
    one, other = make_agent(name="one"), make_agent(name="other")
    for agent in (one, other):
        response = client.post(
            URL,
            json.dumps(batch("same-id")),
            content_type="application/json",
            headers=agent.headers,
        )
        assert response.status_code == 202
    assert stored(one.job_id) == stored(other.job_id) == 3


@pytest.mark.django_db
@pytest.mark.parametrize(
    "value, problem",
    [
        (17, "must be a string or null, not a number"),
        ("", "must be 1 to 128 characters among A-Z a-z 0-9 . _ : + / -"),
        ("x" * 129, "must be 1 to 128 characters among A-Z a-z 0-9 . _ : + / -"),
        ("run 1", "must be 1 to 128 characters among A-Z a-z 0-9 . _ : + / -"),
        ("run\u00e9", "must be 1 to 128 characters among A-Z a-z 0-9 . _ : + / -"),
    ],
)
def test_a_malformed_batch_id_is_refused_naming_the_field(agent, agent_post, value, problem):
    response = agent_post(URL, {**batch(None), "batch": value})
    assert response.status_code == 400
    assert response.json()["fields"] == {"batch": problem}
    assert stored(agent.job_id) == 0


@pytest.mark.django_db
def test_a_refused_batch_does_not_take_its_id(agent, agent_post):
    bad = {"batch": "run1-9", "points": [{"name": "loss", "step": -1, "value": 1.0}]}
    assert agent_post(URL, bad).status_code == 400
    assert agent_post(URL, batch("run1-9")).json()["accepted"] == 3
    assert stored(agent.job_id) == 3


def _post_raw(console: str, token: str, body: bytes) -> dict:
    request = urllib.request.Request(
        f"{console}{URL}",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


@pytest.mark.django_db(transaction=True)
def test_two_copies_sent_at_once_on_two_connections_are_stored_once(live_console, agent):
    rounds, size = 6, 3000
    for number in range(rounds):
        body = json.dumps(batch(f"race-{number}", start=number * size, count=size)).encode()
        barrier = threading.Barrier(2)
        answers: list[dict] = []

        def send(
            body: bytes = body, barrier: threading.Barrier = barrier, answers: list = answers
        ) -> None:
            barrier.wait()
            answers.append(_post_raw(live_console, agent.token, body))

        threads = [threading.Thread(target=send) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert [a["accepted"] for a in answers] == [size, size]
    assert stored(agent.job_id) == rounds * size
    assert MetricBatch.objects.filter(job_id=agent.job_id).count() == rounds


def ws_url(http_url: str) -> str:
    return http_url.replace("http://", "ws://") + "/ws/agent/"


@pytest.mark.django_db(transaction=True)
def test_over_the_websocket_a_retried_batch_is_stored_once(live_console, agent):
    message = json.dumps({"type": "metrics", **batch("ws-1", count=4)})
    with connect(ws_url(live_console), additional_headers=agent.headers) as socket:
        socket.send(message)
        first = json.loads(socket.recv(timeout=30))
    with connect(ws_url(live_console), additional_headers=agent.headers) as socket:
        socket.send(message)  # the first answer was lost with its socket: sent again
        retry = json.loads(socket.recv(timeout=30))
    assert first == retry == {"type": "accepted", "batch": "ws-1", "accepted": 4}
    assert stored(agent.job_id) == 4


@pytest.mark.django_db(transaction=True)
def test_over_two_websockets_at_once_a_batch_is_stored_once(live_console, agent):
    size = 3000
    answers: list[dict] = []
    barrier = threading.Barrier(2)

    def send(number: int) -> None:
        with connect(ws_url(live_console), additional_headers=agent.headers) as socket:
            barrier.wait()
            socket.send(json.dumps({"type": "metrics", **batch("ws-race", count=size)}))
            answers.append(json.loads(socket.recv(timeout=60)))

    threads = [threading.Thread(target=send, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert [a["accepted"] for a in answers] == [size, size]
    assert stored(agent.job_id) == size


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "text, field",
    [
        ('{"type": "metrics", "points": [], "points": []}', "points"),
        ('{"type": "metrics", "batch": 5, "points": []}', "batch"),
        (
            '{"type": "metrics", "points": [{"name": "loss", "step": -1, "value": 1}]}',
            "points[0].step",
        ),
    ],
)
def test_over_the_websocket_a_bad_batch_is_refused_and_nothing_stored(
    live_console, agent, text, field
):
    with connect(ws_url(live_console), additional_headers=agent.headers) as socket:
        socket.send(text)
        answer = json.loads(socket.recv(timeout=30))
    assert answer["type"] == "error" and field in json.dumps(answer["fields"])
    assert stored(agent.job_id) == 0


@pytest.mark.django_db(transaction=True)
def test_a_copy_arriving_while_the_first_is_uncommitted_waits_and_is_not_stored(agent):
    """What two console processes do with two copies of one batch: the second copy's
    transaction waits for the first (the job row, then the unique index) and finds its record.
    One Daphne runs sync views on one thread, so this races two database connections
    directly, with the first held open across the second's arrival."""
    from django.db import connection, transaction

    from breakers.agent.protocol import PointIn
    from breakers.agent.store import store_batch

    points = [PointIn("loss", step, 1.0, None, None) for step in range(50)]
    first_stored, release = threading.Event(), threading.Event()
    results: dict[str, object] = {}

    def first() -> None:
        with transaction.atomic():
            results["first"] = store_batch(agent.job_id, points, "held-1")
            first_stored.set()
            release.wait(30)  # uncommitted while the second copy arrives
        connection.close()

    def second() -> None:
        results["second"] = store_batch(agent.job_id, points, "held-1")
        connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    threads[0].start()
    assert first_stored.wait(30)
    threads[1].start()

    def second_waits_on_a_lock() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
            return cursor.fetchone()[0] >= 1

    wait_for(second_waits_on_a_lock, "the second copy to wait for the first's transaction")
    assert "second" not in results
    release.set()
    for thread in threads:
        thread.join(30)
    assert results["first"] == (50, False) and results["second"] == (50, True)
    assert stored(agent.job_id) == 50
