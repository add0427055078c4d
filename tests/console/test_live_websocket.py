"""/ws/live/: the console's websocket — session auth, subscriptions judged by the authority,
service events forwarded unchanged, metrics.appended coalesced per job."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from console.live import METRICS_INTERVAL, ConsoleConsumer
from core.realtime import job_group
from incidents.alerts.lifecycle import alert_payload
from incidents.models import Alert, Membership, Role, Team
from tests.console.test_console_pages import signal

live = pytest.mark.django_db(transaction=True)
# How long to wait for an event that must come: generous, because a loaded machine (the whole
# suite on two cores) delays it; a test that passes never waits this long.
EVENT = 60.0


def person(username: str, team: str, role: str = Role.VIEWER):
    user = get_user_model().objects.create_user(username, password="pw")
    Membership.objects.create(user=user, team=Team.objects.get_or_create(name=team)[0], role=role)
    return user


def session_cookie(client, user) -> str:
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def receive(socket, timeout: float = EVENT) -> dict:
    return json.loads(socket.recv(timeout=timeout))


def post_metrics(base: str, token: str, points: list[dict]) -> None:
    request = urllib.request.Request(
        f"{base}/api/v1/agent/metrics",
        data=json.dumps({"points": points}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=EVENT).read()


@live
def test_subscriptions_are_judged_by_the_authority_through_daphne(live_console, client, make_agent):
    mine = make_agent(team="vision", name="vit")
    theirs = make_agent(team="secret", name="hidden")
    cookie = session_cookie(client, person("vera", "vision", Role.VIEWER))
    url = live_console.replace("http://", "ws://") + "/ws/live/"
    with connect(url, origin=live_console, additional_headers={"Cookie": cookie}) as socket:
        for kind, object_id in [("job", theirs.job_id), ("job", 999_999), ("team", 999_999)]:
            socket.send(json.dumps({"subscribe": kind, "id": object_id}))
            answer = receive(socket)
            assert answer == {
                "type": "refused",
                "to": kind,
                "id": object_id,
                "detail": f"There is no {kind} {object_id} in your teams.",
            }
        socket.send(json.dumps({"subscribe": "job", "id": mine.job_id}))
        assert receive(socket) == {"type": "subscribed", "to": "job", "id": mine.job_id}
        post_metrics(live_console, theirs.token, [{"name": "loss", "step": 1, "value": 9.0}])
        post_metrics(
            live_console,
            mine.token,
            [
                {"name": "loss", "step": 7, "value": 2.5},
                {"name": "loss", "step": 8, "value": "NaN"},
            ],
        )
        appended = receive(socket)
    assert appended == {
        "type": "metrics.appended",
        "job_id": mine.job_id,
        "count": 2,
        "first_step": 7,
        "last_step": 8,
        "latest": {"loss": {"step": 8, "value": "NaN"}},
    }


@live
def test_without_a_session_the_socket_is_closed(live_console):
    url = live_console.replace("http://", "ws://") + "/ws/live/"
    with connect(url, origin=live_console) as socket, pytest.raises(ConnectionClosed) as closed:
        socket.recv(timeout=EVENT)
    assert closed.value.rcvd.code == 4401


async def open_socket(user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(ConsoleConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect(timeout=EVENT)
    assert connected
    return communicator


@live
async def test_alerts_are_forwarded_with_the_rest_payload(make_agent):
    job = await sync_to_async(make_agent)(team="vision", name="vit")
    user = await sync_to_async(person)("olga", "vision", Role.ONCALL)
    socket = await open_socket(user)
    await socket.send_json_to({"subscribe": "job", "id": job.job_id})
    assert (await socket.receive_json_from(timeout=EVENT))["type"] == "subscribed"
    from incidents.alerts.lifecycle import raise_or_update_alert

    outcome = await sync_to_async(raise_or_update_alert)(job.job_id, signal("L3"))
    message = await socket.receive_json_from(timeout=EVENT)
    alert = await sync_to_async(Alert.objects.select_related("job").get)(pk=outcome.alert.pk)
    assert message == {"type": "alert.raised", "alert": alert_payload(alert)}
    await socket.disconnect()


@live
async def test_a_burst_of_batches_is_coalesced_and_the_last_one_is_never_dropped(make_agent):
    job = await sync_to_async(make_agent)(team="vision", name="vit")
    user = await sync_to_async(person)("vera", "vision")
    socket = await open_socket(user)
    await socket.send_json_to({"subscribe": "job", "id": job.job_id})
    await socket.receive_json_from(timeout=EVENT)
    layer = get_channel_layer()
    started = time.monotonic()
    for step in range(30):
        await layer.group_send(
            job_group(job.job_id),
            {
                "type": "metrics.appended",
                "job_id": job.job_id,
                "count": 1,
                "first_step": step,
                "last_step": step,
                "latest": {"loss": {"step": step, "value": float(step)}},
            },
        )
    sent_for = time.monotonic() - started
    received = []
    while not received or received[-1]["last_step"] < 29:
        received.append(await socket.receive_json_from(timeout=EVENT))
    assert await socket.receive_nothing(timeout=3 * METRICS_INTERVAL)
    # At most one update per interval (plus the first, sent at once), and nothing lost.
    assert len(received) <= 2 + sent_for / METRICS_INTERVAL
    assert sum(m["count"] for m in received) == 30
    assert received[-1]["latest"] == {"loss": {"step": 29, "value": 29.0}}
    assert received[0]["first_step"] == 0
    await socket.disconnect()


@live
async def test_bad_messages_get_an_error_and_ping_gets_pong(make_agent):
    user = await sync_to_async(person)("vera", "vision")
    socket = await open_socket(user)
    await socket.send_json_to({"subscribe": "galaxy", "id": 1})
    assert (await socket.receive_json_from(timeout=EVENT))["type"] == "error"
    await socket.send_json_to({"ping": 42})
    assert await socket.receive_json_from(timeout=EVENT) == {"type": "pong", "ping": 42}
    await socket.disconnect()
