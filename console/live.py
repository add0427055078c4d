"""``/ws/live/``: the console's websocket for people (the agent's is ``console.consumers``).

Protocol (JSON both ways):

* client → ``{"subscribe": "job" | "team", "id": N}``, ``{"unsubscribe": "job" | "team",
  "id": N}``, ``{"ping": <anything>}``.
* server → ``{"type": "subscribed", "to": "job", "id": N}``, or ``{"type": "refused", "to":
  "job", "id": N, "detail": "…"}`` (a job of another team and a job that does not exist get
  the same refusal: ids of other teams never leak), ``{"type": "pong", "ping": …}``, and then
  every message the services publish to the subscribed groups, unchanged: ``alert.raised``,
  ``alert.escalated``, ``alert.acknowledged``, ``alert.resolved``, ``command.issued``,
  ``command.acknowledged``, ``executor.finished``, ``escalation.*`` (payloads from the same
  functions as the REST API: ``alert_payload``, ``command_payload``, ``escalation_payload``) and
  ``metrics.appended`` (``{job_id, count, first_step, last_step, latest: {name: {step,
  value}}}``), the latter coalesced here to at most one per ``METRICS_INTERVAL`` per job.

Session-authenticated (``AuthMiddlewareStack`` in ``config.asgi``): no session, close 4401; the
``Origin`` must be one of ``ALLOWED_HOSTS`` (``console.routing``). Access is judged again on
every message and every ``RECHECK_SECONDS``: a deactivated user or a deleted session closes
4401, a subscription the person may no longer view closes 4403.
Subscriptions are judged by ``incidents.teams.authority.decide(role, "view")`` with the person's
role
in the job's team, the same answer the pages and the REST API get.

Why coalesce at the consumer and not the publisher: the publisher (ingest, in the request's
thread) has no event loop of its own to send a trailing update from, and a throttle without a
trailing update would drop the last batch of a burst (the chart would lie until the next
one). Here the loop is at hand: the first batch goes out at once, later ones within the
interval are merged and sent when it ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from core.realtime import job_group, team_group
from incidents.models import Job, Membership
from incidents.teams.authority import Action, decide

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403  # a subscription the person may no longer view (removed from the team)
# Access is judged again on every message received and at least this often (seconds): a
# person removed from a team, deactivated or logged out does not keep hearing its events.
RECHECK_SECONDS = 30.0
METRICS_INTERVAL = 0.1  # seconds: at most ~10 chart updates per second per job
# Group message types forwarded to the browser (the first part of "alert.raised").
FORWARDED = frozenset(
    {"alert", "checkpoint", "command", "executor", "escalation", "metrics", "job", "incident"}
)
MAX_SUBSCRIPTIONS = 500


def team_of(kind: str, object_id: int) -> int | None:
    """The team owning the subscribed object, or None when there is no such object."""
    if kind == "team":
        return object_id
    return Job.objects.filter(pk=object_id).values_list("team_id", flat=True).first()


def may_view(user: Any, kind: str, object_id: int) -> tuple[bool, str]:
    """(allowed, reason) for a subscription: the authority's ``view`` with the team role."""
    team_id = team_of(kind, object_id)
    role = None
    if team_id is not None:
        role = (
            Membership.objects.filter(user=user, team_id=team_id)
            .values_list("role", flat=True)
            .first()
        )
    decision = decide(role, Action.VIEW)
    if decision.allowed:
        return True, decision.reason
    # The same sentence whether the object is another team's or does not exist at all.
    return False, f"There is no {kind} {object_id} in your teams."


def still_allowed(user: Any, session_key: str | None, subscriptions: set[tuple[str, int]]) -> int:
    """0 while the connection may stay open, else the close code."""
    from django.contrib.auth import get_user_model
    from django.contrib.sessions.models import Session

    fresh = get_user_model().objects.filter(pk=user.pk, is_active=True).first()
    if fresh is None:
        return CLOSE_UNAUTHENTICATED
    if session_key is not None and not Session.objects.filter(session_key=session_key).exists():
        return CLOSE_UNAUTHENTICATED
    for kind, object_id in subscriptions:
        if not may_view(fresh, kind, object_id)[0]:
            return CLOSE_FORBIDDEN
    return 0


def merge_appended(pending: dict[str, Any] | None, message: dict[str, Any]) -> dict[str, Any]:
    """Two "metrics.appended" summaries of one job as one: the span and the newest values."""
    if pending is None:
        return {**message, "latest": dict(message.get("latest", {}))}
    latest = dict(pending["latest"])
    for name, point in message.get("latest", {}).items():
        if name not in latest or point["step"] >= latest[name]["step"]:
            latest[name] = point
    return {
        **pending,
        "count": pending["count"] + message["count"],
        "first_step": min(pending["first_step"], message["first_step"]),
        "last_step": max(pending["last_step"], message["last_step"]),
        "latest": latest,
    }


class ConsoleConsumer(AsyncJsonWebsocketConsumer):
    closed = False
    session_key: str | None = None
    watcher: asyncio.Future | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            # Accepted first so the browser sees the 4401 code (a refused handshake is an
            # anonymous 1006 to it) and stops reconnecting: the session is gone.
            await self.accept()
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        self.groups_joined: set[str] = set()
        self.last_sent: dict[int, float] = {}  # job id → monotonic time of the last update
        self.pending: dict[int, dict[str, Any]] = {}  # job id → merged, not yet sent
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self.subscriptions: set[tuple[str, int]] = set()
        session = self.scope.get("session")
        self.session_key: str | None = getattr(session, "session_key", None)
        self.closed = False
        await self.accept()
        self.watcher = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while not self.closed:
            await asyncio.sleep(RECHECK_SECONDS)
            if not await self._recheck():
                return

    async def _recheck(self) -> bool:
        """Judge the connection again; close it (and say False) when it may not stay."""
        if self.closed:
            return False
        code = await database_sync_to_async(still_allowed)(
            self.scope["user"], self.session_key, set(getattr(self, "subscriptions", ()))
        )
        if code:
            self.closed = True
            await self.close(code=code)
            return False
        return True

    async def disconnect(self, code: int) -> None:
        self.closed = True
        if self.watcher is not None and self.watcher is not asyncio.current_task():
            self.watcher.cancel()
        for timer in getattr(self, "timers", {}).values():
            timer.cancel()
        for group in getattr(self, "groups_joined", set()):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not await self._recheck():
            return
        if not isinstance(content, dict):
            content = {}
        if "ping" in content:
            await self.send_json({"type": "pong", "ping": content["ping"]})
            return
        verb = "subscribe" if "subscribe" in content else "unsubscribe"
        kind, object_id = content.get(verb), content.get("id")
        if kind not in ("job", "team") or not isinstance(object_id, int) or object_id < 1:
            await self.send_json(
                {
                    "type": "error",
                    "detail": 'Send {"subscribe": "job" | "team", "id": <id>} '
                    'or {"unsubscribe": …}.',
                }
            )
            return
        group = job_group(object_id) if kind == "job" else team_group(object_id)
        if verb == "unsubscribe":
            self.groups_joined.discard(group)
            self.subscriptions.discard((kind, object_id))
            await self.channel_layer.group_discard(group, self.channel_name)
            await self.send_json({"type": "unsubscribed", "to": kind, "id": object_id})
            return
        await self._subscribe(kind, object_id, group)

    async def _subscribe(self, kind: str, object_id: int, group: str) -> None:
        allowed, reason = await database_sync_to_async(may_view)(
            self.scope["user"], kind, object_id
        )
        if allowed and len(self.groups_joined) >= MAX_SUBSCRIPTIONS:
            allowed, reason = False, f"At most {MAX_SUBSCRIPTIONS} subscriptions per connection."
        if not allowed:
            await self.send_json({"type": "refused", "to": kind, "id": object_id, "detail": reason})
            return
        await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined.add(group)
        self.subscriptions.add((kind, object_id))
        await self.send_json({"type": "subscribed", "to": kind, "id": object_id})

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Services publish many event types; the forwarded families are listed once here
        # instead of one handler method per type.
        family = message.get("type", "").split(".", 1)[0]
        if family not in FORWARDED:
            await super().dispatch(message)
        elif message["type"] == "metrics.appended":
            await self._coalesce(message)
        else:
            await self.send_json(message)

    async def _coalesce(self, message: dict[str, Any]) -> None:
        job_id = message["job_id"]
        self.pending[job_id] = merge_appended(self.pending.get(job_id), message)
        if job_id in self.timers:
            return  # a send is already scheduled; it will carry this batch too
        wait = self.last_sent.get(job_id, 0.0) + METRICS_INTERVAL - time.monotonic()
        if wait <= 0:
            await self._flush(job_id)
        else:
            loop = asyncio.get_running_loop()
            self.timers[job_id] = loop.call_later(
                wait, lambda: asyncio.ensure_future(self._flush(job_id))
            )

    async def _flush(self, job_id: int) -> None:
        self.timers.pop(job_id, None)
        message = self.pending.pop(job_id, None)
        if message is None:
            return
        self.last_sent[job_id] = time.monotonic()
        await self.send_json(message)
