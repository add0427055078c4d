"""What each agent endpoint does once its job is known: one table, both front doors.

Agent requests reach these handlers through the lean route (``console.agent_lean``, in front of
Django under ASGI) or through the DRF views of ``console.api.agent`` (the Django test client, a
WSGI server, ``BRAKELINE_AGENT_LEAN=0``; the OpenAPI schema documents those views). Both call
the same handler with the same body, so every protocol rule lives once, in the services.

A handler takes the authenticated job, the raw body (bounded, its Content-Type checked) and the
path's parameters, and returns the status and the JSON answer. Adding an endpoint to the lean
route is one row in ``ENDPOINTS`` (an exact path) or ``ID_ENDPOINTS`` (a path carrying an id),
plus its documented DRF view in ``console.api.urls``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from breakers.agent import service as breaker_services
from breakers.agent.bundle import bundle_reply
from breakers.control.replicas import record_replica_heartbeat
from core.errors import InvalidInput, ServiceError, UnsupportedMediaType
from incidents.models import Job

AGENT_PREFIX = "/api/v1/agent/"

TOO_LARGE = "A request body holds at most {limit} bytes. Split the batch."

Handler = Callable[[Job, bytes, int | None], tuple[int, dict[str, Any]]]


class RateLimited(ServiceError):
    """429: the job's agent request rate (``console.ratelimit.agent_wait_seconds``). Its detail
    is the DRF throttle's sentence, so both front doors answer alike."""

    status = 429
    code = "rate_limited"

    def __init__(self, wait_seconds: int):
        unit = "second" if wait_seconds == 1 else "seconds"
        super().__init__(f"Request was throttled. Expected available in {wait_seconds} {unit}.")
        self.wait_seconds = wait_seconds


def check_content_type(header: str) -> None:
    """``application/json``, optionally with ``charset=utf-8``; 415 for anything else."""
    media_type, _, parameters = header.partition(";")
    if media_type.strip().lower() != "application/json":
        raise UnsupportedMediaType(
            f"Send the body as application/json, not {header[:60]!r}.",
            fields={"Content-Type": "must be application/json"},
        )
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            raise InvalidInput(
                "The body must be JSON encoded as UTF-8.",
                fields={"Content-Type": "charset must be utf-8"},
                code="malformed_json",
            )


def body_is_typed(declared_length: str, content_type: str) -> bool:
    """Whether the Content-Type is checked: an empty body without one carries no type (it is
    refused as malformed JSON by the parser instead)."""
    return declared_length not in ("", "0") or bool(content_type)


def metrics(job: Job, body: bytes, _id: int | None) -> tuple[int, dict[str, Any]]:
    # A retried batch (same id) gets the same answer as its first copy: nothing tells the
    # agent apart from the first reply, so an agent has no duplicate case to handle.
    return 202, breaker_services.metrics_reply(job, body)


def heartbeat(job: Job, body: bytes, _id: int | None) -> tuple[int, dict[str, Any]]:
    return 200, {"commands": breaker_services.heartbeat_reply(job.pk, body)}


def command_ack(job: Job, body: bytes, command_id: int | None) -> tuple[int, dict[str, Any]]:
    command = breaker_services.receive_acknowledgement(job.pk, command_id or 0, body)
    return 200, {"id": command.pk, "status": command.status}


def replica_heartbeat(job: Job, body: bytes, _id: int | None) -> tuple[int, dict[str, Any]]:
    return 200, record_replica_heartbeat(job, body)


def bundle(job: Job, body: bytes, _id: int | None) -> tuple[int, dict[str, Any]]:
    # A node's ranks' requests in one (breakers.agent.bundle): each part served as its own.
    return 200, bundle_reply(job, body)


# The hot path: what every rank (or replica) sends about once a second, and its acks. The rare
# uploads (snapshots, checkpoints) keep their DRF views only.
ENDPOINTS: dict[str, Handler] = {
    f"{AGENT_PREFIX}metrics": metrics,
    f"{AGENT_PREFIX}heartbeat": heartbeat,
    f"{AGENT_PREFIX}replicas/heartbeat": replica_heartbeat,
    f"{AGENT_PREFIX}bundle": bundle,
}
# Paths with one whole-number id, as Django's <int:…> converter reads it.
ID_ENDPOINTS: list[tuple[re.Pattern[str], Handler]] = [
    (re.compile(rf"^{AGENT_PREFIX}commands/([0-9]+)/ack$"), command_ack),
]


@dataclass(frozen=True)
class Route:
    handler: Handler
    id: int | None = None


def resolve(path: str) -> Route | None:
    """The lean route of ``path``, or None: Django's URLs answer it (a 404, a rarer upload)."""
    handler = ENDPOINTS.get(path)
    if handler is not None:
        return Route(handler)
    for pattern, handler in ID_ENDPOINTS:
        found = pattern.match(path)
        if found is None:
            continue
        try:
            return Route(handler, int(found.group(1)))
        except ValueError:  # more digits than int() takes: Django's converter refuses it too
            return None
    return None
