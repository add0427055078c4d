"""A node's bundle: the requests of several ranks of one node in one HTTP request.

The ranks of a node hand their requests (metrics batches, heartbeats, acknowledgements) to one
forwarder on the node (the SDK's ``brakeline._node``), which sends them together every
interval. Each part is the body one rank would have posted on its own, and it is answered as
that request would have been, by the same service function: a bundle changes the number of
requests the console serves, never what one rank's report means. So the console keeps every
rank's heartbeat and series apart, and a part's refusal names its rank's field as before.

Hostile until parsed: the bundle's own shape (``parts``, each ``path`` and ``body``) is checked
whole before any part is served (400 naming ``parts[i].path``, nothing written); then each part
is validated on its own and answered with its own status, so one rank's malformed batch
refuses only that part.

Served as one: a node's parts cost the console about what one rank's request does. The bundle
is one transaction; each part's own writes (a batch's id claim and riding heartbeat, a
heartbeat, an acknowledgement) leave nothing of a part refused there: the acknowledgements of
one command are recorded together, where the last of them stands, in a savepoint of their own
(the job's row locked once, one INSERT, one count: ``acknowledge_command_ranks``), a refused
one writing nothing; a validated batch or heartbeat, whose only refusal while stored is a new
run under a finished job's token, writes in one when the job is final — a refusal met
without one rolls the bundle back whole and serves it again, every part in a savepoint.
Then the points of every batch stored are written in one COPY, the job's step moved once,
the commands owed to the bundle's ranks looked up once, and the live charts told once. A
steady heartbeat writes its rank's row only, and the bundle's steady ones are written
together, one read and one UPDATE for them all (``service.record_rank_heartbeats``); the
job's row is locked last (by the step's move) or by rank 0's beat, for the few statements
left to the commit.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from breakers.agent import service
from breakers.agent.protocol import HeartbeatIn, json_type, parse_heartbeat, parse_json_object
from breakers.agent.store import (
    Stored,
    claim_batch,
    claim_batches,
    on_dropped_partition,
    prepare_blocks,
    write_points,
)
from breakers.control.commands import deliverable_commands, deliverable_to_each
from breakers.models import Command
from core.errors import InvalidInput, ServiceError
from incidents.models import FINAL_JOB_STATUSES, Job, JobStatus

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
    if connection.vendor != "postgresql":  # the embedded mode: a part at a time
        return {"results": [_serve(job, part) for part in parts]}
    received_at = timezone.now()
    read = [_read(job, part, received_at) for part in parts]
    blocks = [block for each in read if isinstance(each, _Batch) for block in each.blocks or ()]
    return {"results": on_dropped_partition(blocks, lambda: _serve_bundle(job, read))}


class _RefusedAfterWriting(Exception):
    """A part was refused after a write of its own, with no savepoint to undo just that: the
    bundle's transaction rolls back whole, and it is served again, every part in a savepoint."""


def _serve_bundle(job: Job, read: list[_Read]) -> list[dict[str, Any]]:
    # A validated batch or heartbeat is refused while stored only as a new run under a
    # finished job's token (a 409): a savepoint per part (two statements each) is paid for
    # the final job only, and for the rare refusal that comes as the job finishes.
    if job.status not in FINAL_JOB_STATUSES:
        try:
            return _serve_together(job, read, careful=False)
        except _RefusedAfterWriting:
            pass
    return _serve_together(job, read, careful=True)


def _serve(job: Job, part: PartIn) -> dict[str, Any]:
    try:
        with transaction.atomic():
            status, body = _SERVERS[_verb(part)](job, part)
    except ServiceError as error:
        return {"status": error.status, "body": error.as_body()}
    return {"status": status, "body": body}


@dataclass(slots=True)
class _Batch:
    """A metrics part, validated, with its block rows; ``stored`` once served."""

    batch: service.BatchIn
    blocks: list[tuple] | None
    received_at: datetime
    stored: Stored | None = None
    # Claimed with the bundle's other batches (``_claim_together``): then ``earlier`` is what
    # a first copy stored (None: this one claimed its id).
    claimed: bool = False
    earlier: int | None = None


_Read = _Batch | HeartbeatIn | PartIn | ServiceError


def _read(job: Job, part: PartIn, received_at: datetime) -> _Read:
    """A part validated before anything of the bundle is written (its refusal, if any)."""
    try:
        if part.path == "metrics":
            batch = service.parse_batch(parse_json_object(part.body))
            blocks = prepare_blocks(job.pk, batch.points, received_at)
            return _Batch(batch, blocks, received_at)
        if part.path == "heartbeat":
            return parse_heartbeat(part.body)
    except ServiceError as error:
        return error
    return part  # an acknowledgement: read by its own service


def _serve_together(job: Job, read: list[_Read], *, careful: bool) -> list[dict[str, Any]]:
    """The bundle in one transaction: each part's own writes (a batch's claim and riding
    heartbeat, a heartbeat, an acknowledgement; ``careful``: each in a savepoint of its own,
    so a refused part leaves nothing; else the heartbeats of the parts between two
    acknowledgements written together); then the points of every stored batch in one write,
    the commands owed looked up once for the bundle's ranks, and one live message."""
    for each in read:
        if isinstance(each, _Batch):  # served again: nothing of the first try stands
            each.stored, each.claimed, each.earlier = None, False, None
    with transaction.atomic():
        if not careful:
            _claim_together(job, read)
        beats: list[HeartbeatIn] | None = None if careful else []
        outcomes = _write_parts(job, read, beats)
        _write_beats(job, beats)
        batches = [b for b in outcomes if isinstance(b, _Batch) and b.stored is not None]
        fresh = [b for b in batches if b.stored is not None and not b.stored.duplicate]
        points = [p for b in fresh for p in b.batch.points]
        if fresh:
            blocks = [row for b in fresh for row in b.blocks or ()]
            pending = job.status == JobStatus.PENDING
            write_points(job.pk, points, blocks, fresh[0].received_at, job_is_pending=pending)
        if points:
            service.after_stored(job.pk, points)
        # Only a batch's or a heartbeat's answer carries the commands owed to its rank.
        asking = [_rank(each) for each in outcomes if isinstance(each, _Batch | HeartbeatIn)]
        owed = deliverable_to_each(job.pk, asking) if asking else {}
    return [_result(each, owed) for each in outcomes]


def _write_parts(
    job: Job, read: list[_Read], beats: list[HeartbeatIn] | None
) -> list[_Read | dict[str, Any]]:
    """Each part's own writes, in order; a command's acknowledgements together, where the
    last of them stands (its verdict may move the job: the heartbeats before it first)."""
    acks: dict[int, list[int]] = {}
    for index, each in enumerate(read):
        if isinstance(each, PartIn):
            acks.setdefault(each.command_id or 0, []).append(index)
    last = {indexes[-1]: indexes for indexes in acks.values()}
    outcomes: list[_Read | dict[str, Any]] = list(read)
    for index, each in enumerate(read):
        if index in last:
            _write_beats(job, beats)
            group = last[index]
            answers = _acks(job, [part for i in group if isinstance(part := read[i], PartIn)])
            for where, answer in zip(group, answers, strict=True):
                outcomes[where] = answer
        elif not isinstance(each, PartIn):
            outcomes[index] = _write_part(job, each, beats)
    return outcomes


def _write_part(job: Job, part: _Read, beats: list[HeartbeatIn] | None) -> _Read:
    """A batch's or heartbeat's own writes; a refusal is its result. Careful (``beats``
    None), each part writes in a savepoint of its own; else a heartbeat joins ``beats``,
    written before the next acknowledgement or at the end."""
    if isinstance(part, ServiceError | PartIn):
        return part
    if beats is not None:
        try:
            return _write(job, part, beats)
        except ServiceError as error:
            raise _RefusedAfterWriting from error
    try:
        with transaction.atomic():
            return _write(job, part, None)
    except ServiceError as error:
        return error


def _acks(job: Job, parts: list[PartIn]) -> list[dict[str, Any]]:
    """One command's acknowledgements in the bundle, recorded together (in a savepoint of
    their own: a refused one leaves nothing); each part answered on its own."""
    bodies = [part.body for part in parts]
    outcomes = service.receive_acknowledgements(job.pk, parts[0].command_id or 0, bodies)
    return [_ack_result(outcome) for outcome in outcomes]


def _ack_result(outcome: Command | ServiceError) -> dict[str, Any]:
    if isinstance(outcome, ServiceError):
        return {"status": outcome.status, "body": outcome.as_body()}
    return {"status": 200, "body": {"id": outcome.pk, "status": outcome.status}}


def _write_beats(job: Job, beats: list[HeartbeatIn] | None) -> None:
    """The heartbeats gathered so far, together (``service.record_rank_heartbeats``)."""
    if not beats:
        return
    try:
        service.record_rank_heartbeats(job.pk, beats)
    except ServiceError as error:
        raise _RefusedAfterWriting from error
    beats.clear()


def _claim_together(job: Job, read: list[_Read]) -> None:
    """Every batch's id claimed in one statement (a batch id twice in one bundle: the first
    copy claims it, the second is its retry)."""
    batches = [b for b in read if isinstance(b, _Batch) and b.batch.batch_id is not None]
    claims: dict[str, int] = {}
    for each in batches:
        claims.setdefault(each.batch.batch_id or "", len(each.batch.points))
    if not batches:
        return
    earlier = claim_batches(job.pk, claims, batches[0].received_at)
    seen: set[str] = set()
    for each in batches:
        batch_id = each.batch.batch_id or ""
        each.earlier = earlier[batch_id]
        if batch_id in seen and each.earlier is None:
            each.earlier = claims[batch_id]  # what the bundle's first copy stores
        seen.add(batch_id)
        each.claimed = True


def _write(job: Job, part: _Batch | HeartbeatIn, beats: list[HeartbeatIn] | None) -> _Read:
    if isinstance(part, _Batch):
        part.stored = _claim(job, part, beats)
    elif beats is not None:
        beats.append(part)
    else:
        service.record_rank_heartbeat(job.pk, part)
    return part


def _claim(job: Job, part: _Batch, beats: list[HeartbeatIn] | None) -> Stored:
    """The batch's id claimed (a retried batch answers what its first copy stored, and writes
    nothing) and its riding heartbeat written (or joining ``beats``); its points are written
    with the bundle's."""
    batch = part.batch
    if batch.batch_id is not None:
        earlier = (
            part.earlier
            if part.claimed
            else claim_batch(job.pk, batch.batch_id, len(batch.points), part.received_at)
        )
        if earlier is not None:
            return Stored(earlier, duplicate=True)
    if beats is not None and batch.heartbeat is not None:
        beats.append(batch.heartbeat)
    elif (riding := service.riding_writes(job.pk, batch)) is not None:
        riding()
    return Stored(len(batch.points), duplicate=False)


def _rank(outcome: _Read | dict[str, Any]) -> int | None:
    if isinstance(outcome, _Batch):
        return outcome.batch.rank
    if isinstance(outcome, HeartbeatIn):
        return outcome.rank or 0
    return None


def _result(
    outcome: _Read | dict[str, Any], owed: dict[int | None, list[dict[str, Any]]]
) -> dict[str, Any]:
    if isinstance(outcome, ServiceError):
        return {"status": outcome.status, "body": outcome.as_body()}
    if isinstance(outcome, _Batch):
        assert outcome.stored is not None  # every batch that was not refused was claimed
        body = {"accepted": outcome.stored.accepted, "commands": owed[outcome.batch.rank]}
        return {"status": 202, "body": body}
    if isinstance(outcome, HeartbeatIn):
        return {"status": 200, "body": {"commands": owed[outcome.rank or 0]}}
    assert isinstance(outcome, dict)  # an acknowledgement's own answer
    return outcome


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
