"""Simulated ranks that speak the SDK's wire protocol at its defaults, many per process.

Each rank is a handful of asyncio tasks doing what ``brakeline.Run`` does in its threads
(sdk/brakeline/_run.py, _sender.py, _control.py, _push.py, _guard.py), with the same bodies:

* the training loop takes a step every ``step_seconds`` (0.25 s) and logs ``metrics`` values
  per step, encoded as the SDK encodes them (name, step, value, time, node);
* the sender posts what is pending every ``flush_interval`` (1 s) as one batch with a batch
  id (``<run id>-<sequence>``) and the rank, retrying a refused-for-now batch (429, 5xx,
  connection errors) with the same id, honouring ``Retry-After``;
* the control loop heartbeats every ``heartbeat_interval`` (5 s) with step, status, pid,
  hostname, rank and world size, and only after progress while running;
* the push listener keeps a websocket open to ``/ws/agent/?rank=N`` (``websocket=False``:
  commands arrive in replies only);
* each HTTP request opens its own connection (``Connection: close``), as urllib does;
* with ``node_bundles``, the ranks of a node hand their requests to the node's forwarder
  (:class:`NodeRelay`, the SDK's ``brakeline._forwarder``): one bundle when every rank of the
  node has a request waiting, the oldest has waited ``flush_interval`` or an urgent one (an
  ack, a hold) 50 ms; and one websocket per node (``?ranks=…``), fanned out to its ranks.

The NaN: in a data-parallel job a NaN loss on one rank poisons every rank's all-reduced
gradients, so each rank's step guard refuses that update and holds at the step. Each rank
then says ``holding`` (a heartbeat it waits for), posts what it has (the NaN rank's batch
carries the NaN loss), and waits for the console's command; a command with an
``apply_at_step`` is applied at that step boundary and acknowledged with the rank and step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlparse

USER_AGENT = "brakeline-python/fleet-sim"
# An urgent request (an ack, a hold) waits this long for its node's other ranks (the SDK's
# brakeline._forwarder.URGENT_WAIT).
URGENT_WAIT = 0.05


@dataclass
class FleetConfig:
    url: str
    token: str
    ranks: int
    ranks_per_node: int = 8
    step_seconds: float = 0.25
    flush_interval: float = 1.0
    heartbeat_interval: float = 5.0
    metrics: int = 3
    websocket: bool = True
    # The nodes (index: rank // ranks_per_node) whose ranks hold a websocket; None: every node.
    websocket_nodes: set[int] | None = None
    # Protocol extension: a heartbeat due when a batch leaves rides in that batch.
    heartbeat_in_batch: bool = False
    # Protocol 4: each node's ranks speak through one forwarder (NodeRelay): one bundle per
    # interval, one websocket per node.
    node_bundles: bool = False


@dataclass
class Traffic:
    """What the fleet sent and was answered, for the tables and the test's assertions."""

    requests: Counter = field(default_factory=Counter)  # (kind, status) -> count
    accepted_points: int = 0
    sent_points: int = 0
    acked: dict[int, tuple[int, float]] = field(default_factory=dict)  # rank -> (step, at)
    nan_at: float | None = None
    errors: Counter = field(default_factory=Counter)
    parts: int = 0  # the ranks' requests that travelled in bundles
    pushed: Counter = field(default_factory=Counter)  # rank -> commands heard on a websocket
    on_accepted: Any = None  # callback(points) for lag watching


class Http:
    """One POST per connection, as the SDK's urllib transport does."""

    def __init__(self, url: str, token: str, traffic: Traffic) -> None:
        parsed = urlparse(url)
        self.host, self.port = parsed.hostname or "127.0.0.1", parsed.port or 80
        self.token, self.traffic = token, traffic

    async def post(self, kind: str, path: str, body: bytes) -> tuple[int, dict, float | None]:
        head = (
            f"POST /api/v1/agent/{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {self.token}\r\nContent-Type: application/json\r\n"
            f"Accept: application/json\r\nUser-Agent: {USER_AGENT}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write(head.encode() + body)
            raw = await asyncio.wait_for(reader.read(-1), 30)
            writer.close()
        except (OSError, TimeoutError) as error:
            self.traffic.requests[(kind, "conn")] += 1
            self.traffic.errors[type(error).__name__] += 1
            return 0, {}, None
        header, _, payload = raw.partition(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
        retry_after = None
        for line in lines[1:]:
            if line.lower().startswith("retry-after:"):
                with contextlib.suppress(ValueError):
                    retry_after = float(line.split(":", 1)[1])
        self.traffic.requests[(kind, status)] += 1
        try:
            answer = json.loads(payload) if payload else {}
        except ValueError:
            answer = {}
        return status, answer if isinstance(answer, dict) else {}, retry_after


class Rank:
    def __init__(self, fleet: Fleet, rank: int) -> None:
        self.fleet, self.rank = fleet, rank
        self.config = fleet.config
        self.node_index = rank // self.config.ranks_per_node
        self.node = f"sim-node-{self.node_index:04d}"
        self.node_json = json.dumps(self.node)
        self.run_id = uuid.uuid4().hex[:16]
        self.sequence = 0
        self.step = 0
        self.status = "running"
        self.pending: list[str] = []
        self.sealed: tuple[str, list[str]] | None = None
        self.commands: dict[int, dict] = {}
        self.done: set[int] = set()
        self.progress_at_heartbeat = -1
        self.heartbeat_due = 0.0
        self.next_send = 0.0
        self.nan_step: int | None = None
        self.held = asyncio.Event()
        self.sending = asyncio.Lock()
        self.wake = asyncio.Event()
        self.pid = 100_000 + rank
        self.names = [json.dumps(n) for n in ["train/loss", "train/grad_norm", "train/lr"]]
        self.names += [json.dumps(f"train/metric_{i}") for i in range(3, self.config.metrics)]

    async def post(self, kind: str, path: str, body: bytes) -> tuple[int, dict, float | None]:
        """Through the node's forwarder when the fleet has them, else on its own."""
        relay = self.fleet.relays.get(self.node_index)
        if relay is None:
            return await self.fleet.http.post(kind, path, body)
        urgent = kind == "ack" or (kind == "heartbeat" and b'"status": "running"' not in body)
        return await relay.post(self.rank, path, body, urgent)

    # -- the training loop ----------------------------------------------------------------------
    def log(self, values: list[float]) -> None:
        moment = datetime.fromtimestamp(time.time(), tz=UTC).isoformat().replace("+00:00", "Z")
        tail = f',"time":"{moment}","node":{self.node_json}}}'
        for name, value in zip(self.names, values, strict=False):
            text = repr(value) if math.isfinite(value) else '"NaN"'
            self.pending.append(f'{{"name":{name},"step":{self.step},"value":{text}{tail}')

    def values(self) -> list[float]:
        loss = 2.0 / (1 + self.step * 1e-3) + random.random() * 1e-3
        return [loss, 1.0 + random.random() * 0.05, 3e-4] + [0.5] * (self.config.metrics - 3)

    async def train(self, stop: asyncio.Event) -> None:
        # Data-parallel ranks step in lockstep (their all-reduce waits for the slowest): a
        # common clock, each rank a few milliseconds off it.
        tick = self.fleet.epoch + random.random() * 0.02
        await asyncio.sleep(max(0.0, tick - time.monotonic()))
        while not stop.is_set():
            if self.status == "paused":
                await asyncio.sleep(self.config.step_seconds)
                continue
            if await self.apply_due_commands():
                continue
            if self.status == "holding":
                await asyncio.wait([asyncio.ensure_future(self.wake.wait())], timeout=0.25)
                self.wake.clear()
                continue
            self.step += 1
            values = self.values()
            if self.nan_step is not None and self.step >= self.nan_step:
                if self.rank == self.fleet.nan_rank:
                    values[0] = math.nan
                    self.fleet.traffic.nan_at = time.monotonic()
                self.log(values)
                await self.hold()
                continue
            self.log(values)
            tick += self.config.step_seconds
            await asyncio.sleep(max(0.0, tick - time.monotonic()))

    async def hold(self) -> None:
        """The step guard: say "holding", send the offending point at once, wait."""
        self.nan_step = None
        self.status = "holding"
        await self.heartbeat(force=True)
        self.pending.append(
            f'{{"name":"guard.skipped_updates","step":{self.step},"value":1.0,'
            f'"node":{self.node_json}}}'
        )
        await self.send_batch()

    async def apply_due_commands(self) -> bool:
        for command_id, command in sorted(self.commands.items()):
            if command_id in self.done:
                continue
            apply_at = command.get("apply_at_step")
            if isinstance(apply_at, int) and self.step < apply_at:
                if self.status == "holding":
                    self.status = "running"  # released to train up to the named step
                continue
            self.done.add(command_id)
            await self.apply(command_id, command)
            return True
        return False

    async def apply(self, command_id: int, command: dict) -> None:
        kind = command.get("kind")
        if kind in ("checkpoint_and_pause", "pause_data"):
            self.status = "paused"
        elif kind == "resume":
            self.status = "running"
        result = {"rank": self.rank, "step": self.step}
        if isinstance(command.get("apply_at_step"), int):
            result["apply_at_step"] = command["apply_at_step"]
        body = json.dumps({"status": "succeeded", "result": result}).encode()
        while True:
            status, _, retry_after = await self.post("ack", f"commands/{command_id}/ack", body)
            if 200 <= status < 300 or 400 <= status < 500 and status not in (408, 429):
                break
            await asyncio.sleep(retry_after or 0.5)
        if kind == "checkpoint_and_pause" and status == 200:
            self.fleet.traffic.acked[self.rank] = (self.step, time.monotonic())
            self.held.set()
        await self.heartbeat(force=True)

    def offer(self, commands: list) -> None:
        for command in commands or []:
            known = isinstance(command, dict) and isinstance(command.get("id"), int)
            if known and command["id"] not in self.done:
                self.commands.setdefault(command["id"], command)
                self.wake.set()

    # -- the sender -----------------------------------------------------------------------------
    def heartbeat_body(self) -> dict | None:
        if self.status == "running" and self.step == self.progress_at_heartbeat:
            return None
        self.progress_at_heartbeat = self.step
        return {
            "step": self.step,
            "status": self.status,
            "pid": self.pid,
            "hostname": self.node,
            "rank": self.rank,
            "world_size": self.config.ranks,
        }

    async def send_batch(self) -> None:
        # One sender, as the SDK's one metrics thread: the guard's flush waits for a batch
        # already on its way instead of sending the same sealed batch a second time.
        async with self.sending:
            await self._send_batch()

    async def _send_batch(self) -> None:
        if self.sealed is None:
            if not self.pending:
                return
            self.sequence += 1
            self.sealed = (f"{self.run_id}-{self.sequence}", self.pending)
            self.pending = []
        batch_id, lines = self.sealed
        head = f'{{"batch":"{batch_id}",'
        if self.rank:
            head = f'{{"rank":{self.rank},"batch":"{batch_id}",'
        extra = ""
        due = time.monotonic() + self.config.flush_interval >= self.heartbeat_due
        if self.config.heartbeat_in_batch and self.status == "running" and due:
            beat = self.heartbeat_body()
            if beat is not None:
                extra = ',"heartbeat":' + json.dumps(beat)
                self.heartbeat_due = time.monotonic() + self.config.heartbeat_interval
        body = (head + '"points":[' + ",".join(lines) + "]" + extra + "}").encode()
        self.fleet.traffic.sent_points += len(lines)
        status, answer, retry_after = await self.post("metrics", "metrics", body)
        if status == 202 or 400 <= status < 500 and status not in (401, 408, 429):
            self.sealed = None
            if status == 202:
                self.fleet.traffic.accepted_points += len(lines)
                if self.fleet.traffic.on_accepted:
                    self.fleet.traffic.on_accepted(len(lines))
            self.offer(answer.get("commands", []))
        else:
            self.fleet.traffic.sent_points -= len(lines)
            self.next_send = time.monotonic() + (retry_after or 0.5)

    async def sender(self, stop: asyncio.Event) -> None:
        await asyncio.sleep(random.random() * self.config.flush_interval)
        while not stop.is_set():
            # A batch every flush_interval from the start of the last send (the SDK's
            # _last_send), so a slow answer delays the next batch only beyond the interval.
            started = time.monotonic()
            if started >= self.next_send:
                await self.send_batch()
            wait = started + self.config.flush_interval - time.monotonic()
            await asyncio.sleep(max(0.001, wait))

    async def heartbeat(self, force: bool = False) -> None:
        body = self.heartbeat_body() if not force else None
        if force:
            self.progress_at_heartbeat = self.step
            body = {
                "step": self.step,
                "status": self.status,
                "pid": self.pid,
                "hostname": self.node,
                "rank": self.rank,
                "world_size": self.config.ranks,
            }
        if body is None:
            return
        self.heartbeat_due = time.monotonic() + self.config.heartbeat_interval
        status, answer, _ = await self.post("heartbeat", "heartbeat", json.dumps(body).encode())
        if status == 200:
            self.offer(answer.get("commands", []))

    async def control(self, stop: asyncio.Event) -> None:
        await self.heartbeat(force=True)
        while not stop.is_set():
            await asyncio.sleep(max(0.05, self.heartbeat_due - time.monotonic()))
            if time.monotonic() >= self.heartbeat_due:
                if self.heartbeat_body_due():
                    await self.heartbeat()
                else:
                    self.heartbeat_due = time.monotonic() + self.config.heartbeat_interval

    def heartbeat_body_due(self) -> bool:
        return not (self.status == "running" and self.step == self.progress_at_heartbeat)

    async def push(self, stop: asyncio.Event) -> None:
        from websockets.asyncio.client import connect

        base = self.config.url.replace("http://", "ws://")
        url = f"{base}/ws/agent/?token={self.config.token}&rank={self.rank}"
        while not stop.is_set():
            try:
                async with connect(url, open_timeout=30, proxy=None) as socket:
                    while not stop.is_set():
                        try:
                            message = await asyncio.wait_for(socket.recv(), 1.0)
                        except TimeoutError:
                            continue
                        payload = json.loads(message)
                        if payload.get("type") == "command":
                            self.fleet.traffic.pushed[self.rank] += 1
                            self.offer([payload.get("command")])
            except Exception as error:  # reconnect, as the SDK does
                self.fleet.traffic.errors[f"ws:{type(error).__name__}"] += 1
                await asyncio.sleep(1.0)


class NodeRelay:
    """A node's forwarder: its ranks' requests in one bundle, its one websocket fanned out."""

    def __init__(self, fleet: Fleet, index: int, ranks: list[Rank]) -> None:
        self.fleet, self.index, self.ranks = fleet, index, ranks
        self.waiting: list[tuple[int, str, bytes, bool, asyncio.Future]] = []
        self.arrived = asyncio.Event()

    async def post(self, rank: int, path: str, body: bytes, urgent: bool) -> tuple:
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        self.waiting.append((rank, path, body, urgent, answer))
        self.arrived.set()
        return await answer

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.arrived.wait()
            self.arrived.clear()
            deadline = time.monotonic() + self.fleet.config.flush_interval
            while self.waiting and not self.ready() and time.monotonic() < deadline:
                if any(urgent for *_, urgent, _ in self.waiting):
                    deadline = min(deadline, time.monotonic() + URGENT_WAIT)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.arrived.wait(), deadline - time.monotonic())
                self.arrived.clear()
            parts, self.waiting = self.waiting, []
            if parts:
                await self.send(parts)

    def ready(self) -> bool:
        ranks = {rank for rank, *_ in self.waiting}
        return len(ranks) >= len(self.ranks)

    async def send(self, parts: list) -> None:
        bundle = {"parts": [{"path": path, "body": body.decode()} for _, path, body, _, _ in parts]}
        self.fleet.traffic.parts += len(parts)
        status, answer, retry_after = await self.fleet.http.post(
            "bundle", "bundle", json.dumps(bundle).encode()
        )
        results = answer.get("results") if status == 200 else None
        for index, (*_, future) in enumerate(parts):
            if isinstance(results, list) and len(results) == len(parts):
                result = results[index]
                future.set_result((result["status"], result["body"], None))
            else:
                future.set_result((status, answer, retry_after))

    async def push(self, stop: asyncio.Event) -> None:
        """The node's one websocket; a command goes to the ranks it names (all: a push)."""
        from websockets.asyncio.client import connect

        base = self.fleet.config.url.replace("http://", "ws://")
        ranks = ",".join(str(rank.rank) for rank in self.ranks)
        url = f"{base}/ws/agent/?token={self.fleet.config.token}&ranks={ranks}"
        while not stop.is_set():
            try:
                async with connect(url, open_timeout=30, proxy=None) as socket:
                    while not stop.is_set():
                        try:
                            message = await asyncio.wait_for(socket.recv(), 1.0)
                        except TimeoutError:
                            continue
                        payload = json.loads(message)
                        if payload.get("type") == "command":
                            named = payload.get("ranks")
                            for rank in self.ranks:
                                if named is None or rank.rank in named:
                                    self.fleet.traffic.pushed[rank.rank] += 1
                                    rank.offer([payload.get("command")])
            except Exception as error:  # reconnect, as the SDK does
                self.fleet.traffic.errors[f"ws:{type(error).__name__}"] += 1
                await asyncio.sleep(1.0)


class Fleet:
    def __init__(self, config: FleetConfig, traffic: Traffic | None = None) -> None:
        self.config = config
        self.traffic = traffic or Traffic()
        self.http = Http(config.url, config.token, self.traffic)
        self.ranks = [Rank(self, rank) for rank in range(config.ranks)]
        self.relays: dict[int, NodeRelay] = {}
        if config.node_bundles:
            nodes: dict[int, list[Rank]] = {}
            for rank in self.ranks:
                nodes.setdefault(rank.node_index, []).append(rank)
            self.relays = {index: NodeRelay(self, index, ranks) for index, ranks in nodes.items()}
        self.nan_rank = random.randrange(config.ranks)
        self.nan_step: int | None = None
        self.epoch = time.monotonic() + 0.5
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task] = []

    def start(self) -> None:
        nodes = self.config.websocket_nodes
        for rank in self.ranks:
            jobs = [rank.train(self.stop), rank.sender(self.stop), rank.control(self.stop)]
            heard = self.config.websocket and (nodes is None or rank.node_index in nodes)
            if heard and not self.relays:
                jobs.append(rank.push(self.stop))
            self.tasks += [asyncio.ensure_future(job) for job in jobs]
        for index, relay in self.relays.items():
            jobs = [relay.run(self.stop)]
            if self.config.websocket and (nodes is None or index in nodes):
                jobs.append(relay.push(self.stop))
            self.tasks += [asyncio.ensure_future(job) for job in jobs]

    def inject_nan(self) -> int:
        """Every rank holds at one step after the highest step any rank is at now."""
        step = max(rank.step for rank in self.ranks) + 1
        self.nan_step = step
        for rank in self.ranks:
            rank.nan_step = step
        return step

    async def wait_held(self, timeout: float) -> bool:
        waits = [asyncio.ensure_future(rank.held.wait()) for rank in self.ranks]
        done, pending = await asyncio.wait(waits, timeout=timeout)
        for task in pending:
            task.cancel()
        return not pending

    async def close(self) -> None:
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
