"""Finding 5 (websockets): /ws/live/ accepted any Origin; an open agent socket survived its
token's revocation and a person's socket survived their removal from the team. Now the Origin
must be an allowed host, and access is judged again on every message and periodically."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from console import consumers, live
from incidents.agent_tokens import revoke_agent_tokens
from incidents.models import Job, Membership, Role, Team

pytestmark = pytest.mark.django_db(transaction=True)
WAIT = 30.0


def member(username: str, team: str, role: str = Role.VIEWER):
    user = get_user_model().objects.create_user(username, password="pw")
    Membership.objects.create(user=user, team=Team.objects.get_or_create(name=team)[0], role=role)
    return user


def test_live_socket_refuses_a_foreign_origin(live_console, client):
    client.force_login(member("vera", "vision"))
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    url = live_console.replace("http://", "ws://") + "/ws/live/"
    for origin in ["https://evil.example", "http://127.0.0.1.evil.example:8000", None]:
        with pytest.raises(InvalidStatus) as refused:
            connect(url, origin=origin, additional_headers={"Cookie": cookie}).close()
        assert refused.value.response.status_code == 403, origin
    with connect(url, origin=live_console, additional_headers={"Cookie": cookie}) as socket:
        socket.send(json.dumps({"ping": 1}))
        assert json.loads(socket.recv(timeout=WAIT)) == {"type": "pong", "ping": 1}


async def live_socket(user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(live.ConsoleConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect(timeout=WAIT)
    assert connected
    return communicator


async def test_a_person_removed_from_the_team_is_closed_on_the_next_message(make_agent):
    job = await sync_to_async(make_agent)(team="vision", name="vit")
    user = await sync_to_async(member)("olga", "vision")
    socket = await live_socket(user)
    await socket.send_json_to({"subscribe": "job", "id": job.job_id})
    assert (await socket.receive_json_from(timeout=WAIT))["type"] == "subscribed"
    await sync_to_async(Membership.objects.filter(user=user).delete)()
    await socket.send_json_to({"ping": 1})
    closed = await socket.receive_output(timeout=WAIT)
    assert closed == {"type": "websocket.close", "code": live.CLOSE_FORBIDDEN}


async def test_a_person_removed_from_the_team_is_closed_by_the_periodic_check(
    make_agent, monkeypatch
):
    monkeypatch.setattr(live, "RECHECK_SECONDS", 0.2)
    job = await sync_to_async(make_agent)(team="vision", name="vit")
    user = await sync_to_async(member)("olga", "vision")
    socket = await live_socket(user)
    await socket.send_json_to({"subscribe": "job", "id": job.job_id})
    assert (await socket.receive_json_from(timeout=WAIT))["type"] == "subscribed"
    await sync_to_async(Membership.objects.filter(user=user).delete)()
    closed = await socket.receive_output(timeout=WAIT)  # nothing sent: the timer notices
    assert closed == {"type": "websocket.close", "code": live.CLOSE_FORBIDDEN}


async def test_a_deactivated_person_is_closed_4401(make_agent, monkeypatch):
    monkeypatch.setattr(live, "RECHECK_SECONDS", 0.2)
    user = await sync_to_async(member)("olga", "vision")
    socket = await live_socket(user)
    await sync_to_async(get_user_model().objects.filter(pk=user.pk).update)(is_active=False)
    closed = await socket.receive_output(timeout=WAIT)
    assert closed == {"type": "websocket.close", "code": live.CLOSE_UNAUTHENTICATED}


async def agent_socket(token: str) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(
        consumers.AgentConsumer.as_asgi(),
        "/ws/agent/",
        headers=[(b"authorization", f"Bearer {token}".encode())],
    )
    connected, _ = await communicator.connect(timeout=WAIT)
    assert connected
    return communicator


async def test_a_revoked_agent_token_closes_the_open_socket_on_the_next_message(make_agent):
    agent = await sync_to_async(make_agent)(team="vision", name="vit")
    socket = await agent_socket(agent.token)
    job = await sync_to_async(Job.objects.get)(pk=agent.job_id)
    await sync_to_async(revoke_agent_tokens)(job)
    await socket.send_json_to({"type": "ack", "id": 1, "status": "succeeded"})
    closed = await socket.receive_output(timeout=WAIT)
    assert closed == {"type": "websocket.close", "code": consumers.CLOSE_UNAUTHENTICATED}


async def test_a_revoked_agent_token_closes_the_idle_socket(make_agent, monkeypatch):
    monkeypatch.setattr(consumers, "RECHECK_SECONDS", 0.2)
    agent = await sync_to_async(make_agent)(team="vision", name="vit")
    socket = await agent_socket(agent.token)
    job = await sync_to_async(Job.objects.get)(pk=agent.job_id)
    await sync_to_async(revoke_agent_tokens)(job)
    closed = await socket.receive_output(timeout=WAIT)
    assert closed == {"type": "websocket.close", "code": consumers.CLOSE_UNAUTHENTICATED}


async def test_a_revoked_agent_tokens_socket_is_closed_at_once_and_gets_no_command(make_agent):
    """Without waiting for the periodic check (30 s): a command issued right after the
    revocation never reaches the socket, which is closed 4401 at once."""
    from breakers.control.commands import issue_command

    agent = await sync_to_async(make_agent)(team="vision", name="vit-push")
    socket = await agent_socket(agent.token)
    job = await sync_to_async(Job.objects.get)(pk=agent.job_id)
    await sync_to_async(revoke_agent_tokens)(job)
    await sync_to_async(issue_command)(agent.job_id, "lower_lr", reason="x", severity="L2")
    closed = await socket.receive_output(timeout=WAIT)
    assert closed == {"type": "websocket.close", "code": consumers.CLOSE_UNAUTHENTICATED}
    assert consumers.RECHECK_SECONDS >= 30  # the periodic check did not do it
