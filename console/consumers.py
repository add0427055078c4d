"""Websocket consumers. The agent's: commands pushed the moment they are committed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from breakers.agent import service as breaker_services
from breakers.agent.ack_rank import MAX_RANK
from breakers.agent.bundle import MAX_BUNDLE_PARTS, deliverable_to_ranks
from breakers.agent.protocol import is_whole_number, parse_json_object
from breakers.agent.store import Stored
from breakers.control.backlog import AGENT_REQUESTS
from breakers.control.commands import deliverable_commands, mark_delivered
from console.api.agent_auth import bearer_token
from console.ratelimit import agent_rate, rate_counter
from core.errors import InvalidInput, PayloadTooLarge, ServiceError
from core.realtime import agent_group
from incidents.agent_tokens import authenticate_agent
from incidents.models import Job

CLOSE_UNAUTHENTICATED = 4401
CLOSE_INVALID = 4400
# The token is checked again on every message received and at least this often (seconds): a
# revoked token's open socket is closed (4401), it does not keep receiving commands.
RECHECK_SECONDS = 30.0


def token_from_scope(scope: Mapping[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            return bearer_token(value)
    values = parse_qs(scope.get("query_string", b"").decode()).get("token")
    return values[0] if values else None


def rank_from_scope(scope: Mapping[str, Any]) -> int | None:
    """The ``rank`` query parameter: which rank of a multi-rank job this socket is (None: not
    said — one process, or an older SDK). Hostile: anything but one whole number from 0 to
    2³¹−1 is refused naming the field."""
    values = parse_qs(scope.get("query_string", b"").decode(), keep_blank_values=True).get("rank")
    if values is None:
        return None
    text = values[0]
    if len(values) == 1 and text.isascii() and text.isdigit() and int(text) <= MAX_RANK:
        return int(text)
    raise InvalidInput(
        "The websocket's rank is not valid.",
        fields={"rank": f"must be one whole number from 0 to {MAX_RANK}"},
    )


def ranks_from_scope(scope: Mapping[str, Any]) -> list[int] | None:
    """The ``ranks`` query parameter of a node's one socket (protocol 4): the ranks its
    forwarder hands commands to, comma-separated (None: not said). Hostile: anything but 1 to
    MAX_BUNDLE_PARTS whole numbers from 0 to 2³¹−1 is refused naming the field."""
    values = parse_qs(scope.get("query_string", b"").decode(), keep_blank_values=True).get("ranks")
    if values is None:
        return None
    texts = values[0].split(",")
    if (
        len(values) == 1
        and len(texts) <= MAX_BUNDLE_PARTS
        and all(t.isascii() and t.isdigit() and len(t) <= 10 and int(t) <= MAX_RANK for t in texts)
    ):
        return sorted({int(text) for text in texts})
    raise InvalidInput(
        "The websocket's ranks are not valid.",
        fields={"ranks": f"must be 1 to {MAX_BUNDLE_PARTS} whole numbers from 0 to {MAX_RANK}"},
    )


class AgentConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/agent/``: one training process, authenticated by its job's bearer token."""

    job_id: int | None = None
    watcher: asyncio.Future | None = None
    closed = False

    async def connect(self) -> None:
        token = token_from_scope(self.scope)
        self.token = token or ""
        try:
            job = await database_sync_to_async(authenticate_agent)(token or "")
        except ServiceError:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        try:
            rank = rank_from_scope(self.scope)
            ranks = ranks_from_scope(self.scope)
        except InvalidInput as error:
            await self.accept()  # to say which field, then close
            await self.send_json({"type": "error", **error.as_body()})
            await self.close(code=CLOSE_INVALID)
            return
        self.job_id = job.pk
        await self.channel_layer.group_add(agent_group(job.pk), self.channel_name)
        await self.accept()
        self.watcher = asyncio.ensure_future(self._watch())
        if ranks is not None:
            await self._catch_up_node(job.pk, ranks)
            return
        # Catch-up: whatever was issued while this process had no websocket, less what this
        # rank acknowledged already (the heartbeat replies' rule, the same query).
        for command in await database_sync_to_async(deliverable_commands)(job.pk, rank):
            await self.send_json({"type": "command", "command": command})

    async def _catch_up_node(self, job_id: int, ranks: list[int]) -> None:
        """A node's socket: each open command once, naming the node's ranks that have not
        acknowledged it (pushes after this go to every rank of the node, as to every socket)."""
        for command, waiting in await database_sync_to_async(deliverable_to_ranks)(job_id, ranks):
            await self.send_json({"type": "command", "command": command, "ranks": waiting})

    async def _watch(self) -> None:
        while not self.closed:
            await asyncio.sleep(RECHECK_SECONDS)
            if not await self._recheck():
                return

    async def _recheck(self) -> bool:
        """The token again (revoked? its job's still?); close 4401 and say False if not."""
        if self.closed:
            return False
        try:
            job = await database_sync_to_async(authenticate_agent)(self.token)
        except ServiceError:
            job = None
        if job is None or job.pk != self.job_id:
            self.closed = True
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return False
        return True

    async def disconnect(self, code: int) -> None:
        self.closed = True
        if self.watcher is not None and self.watcher is not asyncio.current_task():
            self.watcher.cancel()
        if self.job_id is not None:
            await self.channel_layer.group_discard(agent_group(self.job_id), self.channel_name)

    async def agent_revoked(self, event: dict) -> None:
        """A token of the job was revoked: this socket's token is checked now, not in 30 s."""
        await self._recheck()

    async def agent_command(self, event: dict) -> None:
        # A command goes only to a socket whose token is still valid (revoked by any path:
        # the API, the admin, the database): checked at each push, which is rare.
        if self.closed or not await self._recheck():
            return
        await self.send_json({"type": "command", "command": event["command"]})
        await database_sync_to_async(mark_delivered)([event["command"]["id"]])

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """Every message is hostile until parsed, as on the HTTP endpoints: within the byte
        limit, UTF-8 JSON without duplicate keys, an object. Held, as an HTTP agent request
        is, until served: the web tier's beacon counts what this process has not served."""
        held = AGENT_REQUESTS.hold()
        try:
            await self._receive(text_data, bytes_data)
        finally:
            held.release()

    async def _receive(self, text_data: str | None, bytes_data: bytes | None) -> None:
        raw = text_data.encode("utf-8", "surrogatepass") if text_data is not None else b""
        raw = raw or bytes_data or b""
        try:
            limit = settings.AGENT_MAX_BATCH_BYTES
            if len(raw) > limit:
                raise PayloadTooLarge(
                    f"A message holds at most {limit} bytes.", fields={"body": f"at most {limit}"}
                )
            content = parse_json_object(raw)
        except ServiceError as error:
            await self.send_json({"type": "error", **error.as_body()})
            return
        await self.receive_json(content)

    async def receive_json(self, content: dict, **kwargs) -> None:
        """Acks, {"type": "ack", "id": 17, "status": …}, and metrics batches,
        {"type": "metrics", "batch": "<id>", "points": […]} (the same rules as over HTTP)."""
        job_id = self.job_id  # set before the socket was accepted: every message has it
        if job_id is None or not await self._recheck():
            return
        if content.get("type") == "metrics":
            await self._receive_metrics(job_id, content)
            return
        # A command id is a whole number; `true` is not 1 (bool is an int in Python).
        if content.get("type") != "ack" or not is_whole_number(content.get("id")):
            wrong = (
                {"id": "must be a command id (a whole number)"}
                if content.get("type") == "ack"
                else {"type": "must be ack or metrics"}
            )
            await self.send_json(
                {
                    "type": "error",
                    "error": "invalid",
                    "detail": 'Send {"type": "ack", "id": <command id>, …} or '
                    '{"type": "metrics", "batch": …, "points": […]}.',
                    "fields": wrong,
                }
            )
            return
        body = {k: v for k, v in content.items() if k in {"status", "result", "error"}}
        try:
            command = await database_sync_to_async(breaker_services.receive_acknowledgement)(
                job_id, content["id"], json.dumps(body).encode()
            )
        except ServiceError as error:
            await self.send_json({"type": "error", **error.as_body()})
            return
        await self.send_json({"type": "acked", "id": command.pk, "status": command.status})

    async def _receive_metrics(self, job_id: int, content: dict) -> None:
        body = {key: value for key, value in content.items() if key != "type"}
        batch = body.get("batch")
        try:
            stored = await database_sync_to_async(self._ingest)(job_id, body)
        except ServiceError as error:
            await self.send_json({"type": "error", "batch": batch, **error.as_body()})
            return
        await self.send_json({"type": "accepted", "batch": batch, "accepted": stored.accepted})

    def _ingest(self, job_id: int, body: dict) -> Stored:
        """The HTTP endpoint's rate limit and service, for a batch sent over the socket."""
        job = Job.objects.get(pk=job_id)
        limit, period = agent_rate(job.world_size)
        wait = rate_counter().hit(f"agent:{job_id}", limit, period)
        if wait:
            raise InvalidInput(
                f"Rate limited: retry in {wait:.0f} s.", code="rate_limited", fields={}
            )
        return breaker_services.ingest_metrics_body(job, body)
