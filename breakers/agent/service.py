"""Breaker services: one function per verb, called by every entry point."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from breakers.agent.ack_rank import ack_rank
from breakers.agent.protocol import (
    MAX_STEP,
    HeartbeatIn,
    PointIn,
    heartbeat_from,
    json_type,
    parse_ack,
    parse_heartbeat,
    parse_json_object,
    parse_metrics_body,
)
from breakers.agent.store import Stored, store_batch
from breakers.control.acknowledge import Answer, acknowledge_command_ranks
from breakers.control.commands import deliverable_commands
from breakers.detection.tasks import schedule_evaluation
from breakers.executors.launchers import record_launcher
from breakers.executors.scheduler import record_scheduler_context
from breakers.models import Command, CommandKind, CommandStatus
from core.errors import InvalidInput, NotFound, ServiceError, or_raise
from core.nonfinite import encode
from core.realtime import job_group, publish_after_commit
from incidents.heartbeats import (
    RankBeat,
    RankPaceReport,
    record_heartbeat,
    record_node_heartbeats,
)
from incidents.models import Job, JobStatus


def ingest_metrics(job: Job, raw_body: bytes) -> Stored:
    """Validate and store one metrics batch of ``job``: all of it or nothing, and once per
    batch id (a retried batch answers what its first copy stored)."""
    return _ingest(job, parse_json_object(raw_body))[0]


def metrics_reply(job: Job, raw_body: bytes) -> dict[str, Any]:
    """Ingest one batch (``ingest_metrics``) and answer it: how many points were accepted and
    the open commands the sending rank has not acknowledged yet (a batch of one rank's points,
    as the SDK sends them; a batch mixing ranks gets every open command)."""
    stored, rank = _ingest(job, parse_json_object(raw_body))
    return {"accepted": stored.accepted, "commands": deliverable_commands(job.pk, rank=rank)}


def ingest_metrics_body(job: Job, body: dict) -> Stored:
    """The same for a batch already decoded (the websocket's metrics messages)."""
    return _ingest(job, body)[0]


@dataclass(frozen=True, slots=True)
class BatchIn:
    """A metrics batch, validated: its points, its id, the heartbeat riding in it, and the
    one rank it speaks for (None: several ranks' points)."""

    points: list[PointIn]
    batch_id: str | None
    heartbeat: HeartbeatIn | None
    rank: int | None


def parse_batch(body: dict) -> BatchIn:
    """Validate a decoded metrics batch whole (InvalidInput naming the first wrong field):
    nothing of it is written before."""
    riding = body.pop("heartbeat", None)
    batch = parse_metrics_body(
        body,
        max_points=settings.AGENT_MAX_BATCH_POINTS,
        time_window_seconds=settings.AGENT_TIME_WINDOW_SECONDS,
    )
    heartbeat = None if riding is None else _riding_heartbeat(riding, body.get("rank") or 0)
    ranks = {point.rank for point in batch.points}
    if not ranks and heartbeat is not None:
        ranks = {heartbeat.rank or 0}
    rank = ranks.pop() if len(ranks) == 1 else None
    return BatchIn(list(batch.points), batch.batch_id, heartbeat, rank)


def riding_writes(job_id: int, batch: BatchIn) -> Callable[[], object] | None:
    """What the batch's transaction writes after its points: its heartbeat, if it carries
    one."""
    heartbeat = batch.heartbeat
    return None if heartbeat is None else lambda: record_rank_heartbeat(job_id, heartbeat)


def after_stored(job_id: int, points: Sequence[PointIn]) -> None:
    """Once stored points commit: wake the evaluator, and tell live charts (one message)."""
    # After commit, so the worker always finds the batch it was woken for (the batch has
    # committed, or will with an outer transaction). robust: a broker hiccup must not turn
    # a stored batch into an error the agent would answer by resending it; the periodic tick
    # evaluates whatever is pending anyway.
    transaction.on_commit(lambda: schedule_evaluation(job_id), robust=True)
    # Live charts: a summary only (the console fetches the new points from the series API);
    # its websocket consumer coalesces these to at most ~10 per second per job.
    publish_after_commit(job_group(job_id), metrics_appended(job_id, points), robust=True)


def _ingest(job: Job, body: dict) -> tuple[Stored, int | None]:
    """Store the batch, and the heartbeat riding in it in the same transaction (a retried
    batch id stores neither again); also the one rank it speaks for."""
    batch = parse_batch(body)
    stored = store_batch(
        job.pk,
        batch.points,
        batch.batch_id,
        job_is_pending=job.status == JobStatus.PENDING,
        then=riding_writes(job.pk, batch),
    )
    if stored.accepted and not stored.duplicate:
        after_stored(job.pk, batch.points)
    return stored, batch.rank


def _riding_heartbeat(raw: object, batch_rank: int) -> HeartbeatIn:
    """The sending rank's heartbeat inside a metrics batch (protocol 3), validated before
    anything is written; it is the batch's rank's (the batch's ``rank``, default 0)."""
    if not isinstance(raw, dict):
        raise InvalidInput(
            "The heartbeat inside a metrics batch must be an object.",
            fields={"heartbeat": f"must be an object, not {json_type(raw)}"},
        )
    # Without a rank of its own it is the batch's: checked as such (world_size above it).
    given = raw if raw.get("rank") is not None else raw | {"rank": batch_rank}
    heartbeat = heartbeat_from(given, "heartbeat")
    if heartbeat.rank != batch_rank:
        raise InvalidInput(
            "A batch carries only its own rank's heartbeat.",
            fields={"heartbeat.rank": f"must be the batch's rank ({batch_rank})"},
        )
    return heartbeat


def metrics_appended(job_id: int, points: Sequence[PointIn]) -> dict:
    """The "metrics.appended" message of a stored batch: its step span and latest values."""
    newest: dict[str, PointIn] = {}
    for point in points:  # one pass of a thousand points: encode only the winners, below
        seen = newest.get(point.name)
        if seen is None or point.step >= seen.step:
            newest[point.name] = point
    steps = [point.step for point in points]
    return {
        "type": "metrics.appended",
        "job_id": job_id,
        "count": len(points),
        "first_step": min(steps),
        "last_step": max(steps),
        "latest": {
            name: {"step": point.step, "value": encode(point.value)}
            for name, point in newest.items()
        },
    }


def heartbeat_reply(job_id: int, raw_body: bytes) -> list[dict]:
    """Record one rank's heartbeat; its reply's commands: the open ones that rank has not
    acknowledged yet (a multi-rank command stays open until every rank has)."""
    heartbeat = parse_heartbeat(raw_body)
    record_rank_heartbeat(job_id, heartbeat)
    return deliverable_commands(job_id, rank=heartbeat.rank or 0)


def record_rank_heartbeat(job_id: int, heartbeat: HeartbeatIn) -> Job:
    """Store a validated heartbeat: the rank's row (and the job's when it says something of
    the whole job), its Slurm context and launcher."""
    job = _record(job_id, heartbeat)
    record_scheduler_context(job_id, heartbeat)
    record_launcher(job_id, heartbeat)  # whom the executor stops: the whole job
    return job


def record_rank_heartbeats(job_id: int, heartbeats: Sequence[HeartbeatIn]) -> None:
    """Store several ranks' validated heartbeats (a node's, in one transaction), each as
    ``record_rank_heartbeat`` does: the steady beats of the ranks' own rows in one read and
    one write, the first beats of new ranks in one (``record_node_heartbeats``), the others
    one at a time, in order. Outside
    Slurm every beat's scheduler context is the same (none): it is stored once."""
    if not heartbeats:
        return
    beats = [_rank_beat(heartbeat) for heartbeat in heartbeats]
    job, left = record_node_heartbeats(job_id, beats, timezone.now())
    for index in left:
        job = _record(job_id, heartbeats[index], known=job)
    outside_slurm = not any(heartbeat.slurm_job_id for heartbeat in heartbeats)
    for heartbeat in heartbeats[-1:] if outside_slurm else heartbeats:
        record_scheduler_context(job_id, heartbeat)
    for heartbeat in heartbeats:
        record_launcher(job_id, heartbeat)


def _rank_beat(heartbeat: HeartbeatIn) -> RankBeat:
    pace = RankPaceReport(heartbeat.sync_step, heartbeat.compute_seconds)
    return RankBeat(
        heartbeat.rank or 0,
        heartbeat.step,
        heartbeat.status,
        heartbeat.pid,
        heartbeat.hostname,
        heartbeat.world_size,
        pace,
    )


def _record(job_id: int, heartbeat: HeartbeatIn, known: Job | None = None) -> Job:
    return record_heartbeat(
        job_id,
        step=heartbeat.step,
        status=heartbeat.status,
        pid=heartbeat.pid,
        hostname=heartbeat.hostname,
        rank=heartbeat.rank,
        world_size=heartbeat.world_size,
        finish_event=_finish_event(job_id, heartbeat.status),
        pace=RankPaceReport(heartbeat.sync_step, heartbeat.compute_seconds),
        known=known,
    )


def _finish_event(job_id: int, status: str) -> str:
    """A process that received a terminate and then says "finished" exited on the terminate:
    its last heartbeat can overtake the acknowledgement (the SDK waits for it, bounded, and
    under load the ack's POST may still be on its way), and a job stopped by an L4 must not
    read "finished" — the final status would then refuse the terminate for good."""
    if status != "finished":
        return "finish"
    told = Command.objects.filter(
        job_id=job_id,
        kind=CommandKind.TERMINATE,
        status__in=(CommandStatus.DELIVERED, CommandStatus.SUCCEEDED),
    )
    return "terminate" if told.exists() else "finish"


def receive_acknowledgement(job_id: int, command_id: int, raw_body: bytes) -> Command:
    """One acknowledgement: ``receive_acknowledgements`` of one body."""
    return or_raise(receive_acknowledgements(job_id, command_id, [raw_body])[0])


def receive_acknowledgements(
    job_id: int, command_id: int, raw_bodies: Sequence[bytes]
) -> list[Command | ServiceError]:
    """Acknowledgements of one command (a node's ranks', in its bundle), each answered on its
    own: the command, or that body's refusal naming its field; the others recorded together
    (``acknowledge_command_ranks``), a refused one writing nothing."""
    parsed = [_answer(raw_body) for raw_body in raw_bodies]
    answers = [each for each in parsed if isinstance(each, Answer)]
    try:
        if not 0 < command_id <= MAX_STEP:  # an id no bigint column holds: no such command
            raise NotFound("No such command of this job.", fields={"id": "no such command"})
        recorded = acknowledge_command_ranks(job_id, command_id, answers) if answers else []
    except ServiceError as error:  # nothing of them written
        recorded = [error] * len(answers)
    answered = iter(recorded)
    return [next(answered) if isinstance(each, Answer) else each for each in parsed]


def _answer(raw_body: bytes) -> Answer | ServiceError:
    try:
        ack = parse_ack(raw_body)
        return Answer(ack.status, ack.result, ack.error, ack_rank(ack.result))
    except ServiceError as error:
        return error
