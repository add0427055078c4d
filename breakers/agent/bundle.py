"""A node's bundle: the requests of several ranks of one node in one HTTP request.

The ranks of a node hand their requests (metrics batches, heartbeats, acknowledgements) to one
forwarder on the node (the SDK's ``brakeline._node``), which sends them together every
interval. Each part is the body one rank would have posted on its own, and it is answered as
that request would have been, by the same service function: a bundle changes the number of
requests the console serves, never what one rank's report means. So the console keeps every
rank's heartbeat and series apart, and a part's refusal names its rank's field as before.

Hostile until parsed: the bundle's own shape (``parts``, each ``path`` and ``body``) is checked
whole before any part is served (400 naming ``parts[i].path``, nothing written); then each part
is served in a transaction of its own, all of it or nothing, and answered with its own status,
so one rank's malformed batch refuses only that part. One transaction per part, not one for the
bundle: a part that moves the job's step locks the job's row until its commit, and that lock
must not be held through the other parts while other nodes' bundles of the job wait for it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from breakers.agent import service
from breakers.agent.protocol import json_type, parse_json_object
from breakers.control.commands import deliverable_commands
from core.errors import InvalidInput, ServiceError
from incidents.models import Job

# A node of 8 ranks sends up to three parts each per interval (a batch, a heartbeat, an ack).
MAX_BUNDLE_PARTS = 256
# The paths a part may name: the per-rank requests of docs/protocol.md.
PART_PATH = re.compile(r"metrics|heartbeat|commands/(?P<command>[0-9]{1,19})/ack")
PART_KEYS = frozenset({"path", "body"})


@dataclass(frozen=True, slots=True)
class PartIn:
    path: str
    body: bytes
    command_id: int | None


def parse_bundle(raw_body: bytes) -> list[PartIn]:
    """The bundle's parts, or InvalidInput naming the first field that is wrong."""
    body = parse_json_object(raw_body)
    unknown = sorted(set(body) - {"parts"})
    if unknown:
        raise InvalidInput(
            "A bundle holds only its parts.", fields={unknown[0]: "unknown field of a bundle"}
        )
    parts = body.get("parts")
    if not isinstance(parts, list) or not 1 <= len(parts) <= MAX_BUNDLE_PARTS:
        raise InvalidInput(
            f"A bundle's parts are an array of 1 to {MAX_BUNDLE_PARTS} parts.",
            fields={"parts": f"must be an array of 1 to {MAX_BUNDLE_PARTS} parts"},
        )
    return [_part(index, part) for index, part in enumerate(parts)]


def _part(index: int, part: object) -> PartIn:
    name = f"parts[{index}]"
    if not isinstance(part, dict):
        raise InvalidInput(
            "A bundle's part is an object.",
            fields={name: f"must be an object, not {json_type(part)}"},
        )
    unknown = sorted(set(part) - PART_KEYS)
    if unknown:
        raise InvalidInput(
            "A part holds a path and a body.", fields={f"{name}.{unknown[0]}": "unknown field"}
        )
    path = part.get("path")
    matched = PART_PATH.fullmatch(path) if isinstance(path, str) else None
    if matched is None:
        raise InvalidInput(
            "A part's path names a rank's request.",
            fields={f"{name}.path": "must be metrics, heartbeat or commands/<id>/ack"},
        )
    body = part.get("body")
    if not isinstance(body, str):
        raise InvalidInput(
            "A part's body is the rank's request body, as a JSON string.",
            fields={f"{name}.body": f"must be a string, not {json_type(body)}"},
        )
    command = matched.group("command")
    return PartIn(
        matched.group(0), body.encode("utf-8", "surrogatepass"), int(command) if command else None
    )


def bundle_reply(job: Job, raw_body: bytes) -> dict[str, Any]:
    """Serve every part of one bundle of ``job``; the answer holds one result per part, in
    order: ``{"status": <the part's own HTTP status>, "body": <its own answer>}``."""
    parts = parse_bundle(raw_body)
    return {"results": [_serve(job, part) for part in parts]}


def _serve(job: Job, part: PartIn) -> dict[str, Any]:
    try:
        with transaction.atomic():
            status, body = _SERVERS[_verb(part)](job, part)
    except ServiceError as error:
        return {"status": error.status, "body": error.as_body()}
    return {"status": status, "body": body}


def _verb(part: PartIn) -> str:
    return "ack" if part.command_id is not None else part.path


def _metrics(job: Job, part: PartIn) -> tuple[int, dict[str, Any]]:
    return 202, service.metrics_reply(job, part.body)


def _heartbeat(job: Job, part: PartIn) -> tuple[int, dict[str, Any]]:
    return 200, {"commands": service.heartbeat_reply(job.pk, part.body)}


def _ack(job: Job, part: PartIn) -> tuple[int, dict[str, Any]]:
    command = service.receive_acknowledgement(job.pk, part.command_id or 0, part.body)
    return 200, {"id": command.pk, "status": command.status}


_SERVERS: dict[str, Callable[[Job, PartIn], tuple[int, dict[str, Any]]]] = {
    "metrics": _metrics,
    "heartbeat": _heartbeat,
    "ack": _ack,
}


def deliverable_to_ranks(job_id: int, ranks: list[int]) -> list[tuple[dict[str, Any], list[int]]]:
    """A node's websocket catch-up: each open command once, with the node's ranks that have
    not acknowledged it (the forwarder hands it to those only), oldest first. The rule is a
    rank's own catch-up's (``deliverable_commands``), asked once per rank of the node."""
    commands: dict[int, dict[str, Any]] = {}
    waiting: dict[int, list[int]] = {}
    for rank in ranks:
        for command in deliverable_commands(job_id, rank=rank):
            commands.setdefault(command["id"], command)
            waiting.setdefault(command["id"], []).append(rank)
    return [(commands[key], waiting[key]) for key in sorted(commands)]
