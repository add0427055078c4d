"""The checkpoint catalogue: recording what jobs report, judging it clean, naming a roll back.

Every front door uses these: the agent's report (``POST /api/v1/agent/checkpoints``), the
acknowledgement of a brake (``checkpoint_and_pause``), the job and incident pages, and the
confirmation of a pause that rolls back (only a catalogue entry can be named).

Where a checkpoint may live is not the agent's to say: every path (the file, a set's manifest
and shards) must be under the job's declared checkpoint root (``breakers.executors.targets.
checkpoint_location``: no ``..``, symlinks resolved, no ``file://``, no other team's root), or
the report is a 400 naming the field. The catalogue and a roll back offer only such entries.

*Clean*, seen from an incident: the checkpoint's weights hold no optimizer update from the
incident's first anomalous step on (``weights_step < first_step``; without ``weights_step``,
its ``step``). The SDK's step guard skips the update of a non-finite step, so the brake's own
checkpoint is usually clean; without the guard it is "after the anomaly". After a roll back that
the job carried out (its resume acknowledged), the run trains again from the restored state and
numbers its steps on from it: a checkpoint reported since then descends from that state, so it
is clean exactly when the restored checkpoint was, whatever its step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeGuard

from django.db import IntegrityError, transaction
from django.utils import timezone

from breakers.executors.targets import (
    checkpoint_locations,
    checkpoint_refusal,
    checkpoints_in_root,
)
from breakers.models import (
    Checkpoint,
    CheckpointReason,
    CheckpointSet,
    Command,
    CommandKind,
    CommandStatus,
)
from core.errors import InvalidInput
from core.realtime import job_group, publish_after_commit
from incidents.models import Incident, Job

MAX_PATH_LENGTH = 4096
MAX_STEP = 2**53  # a step's bound (breakers.agent.points.MAX_STEP); bytes too
REPORT_FIELDS = {"path", "sha256", "step", "bytes", "rank", "reason", "weights_step", "set"}
HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class SetReport:
    """The ``set`` of a checkpoint report: rank 0's manifest and every rank's file."""

    manifest: str
    manifest_sha256: str
    world_size: int
    shards: tuple[dict[str, Any], ...]  # {"rank", "path", "bytes", "sha256"}, rank order


@dataclass(frozen=True)
class CheckpointReport:
    path: str
    sha256: str
    step: int
    bytes: int | None = None
    rank: int = 0
    reason: str = CheckpointReason.MANUAL
    weights_step: int | None = None
    set: SetReport | None = None  # the checkpoint set it belongs to (multi-rank jobs)


def _whole(value: Any, low: int = 0) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_STEP


def parse_report(data: Any) -> CheckpointReport:
    """A checkpoint object (an agent's report or a brake's ack result), every field checked:
    400 naming each bad field, nothing stored."""
    if not isinstance(data, dict):
        raise InvalidInput("A checkpoint report is a JSON object.", fields={"body": "an object"})
    errors: dict[str, str] = {}
    for key in data.keys() - REPORT_FIELDS:
        errors[key] = f"is not a field of a checkpoint ({', '.join(sorted(REPORT_FIELDS))})"
    path, sha256 = data.get("path"), data.get("sha256")
    if not isinstance(path, str) or not 0 < len(path) <= MAX_PATH_LENGTH or "\x00" in path:
        errors["path"] = f"must be a non-empty string of at most {MAX_PATH_LENGTH} characters"
    if not isinstance(sha256, str) or len(sha256) != 64 or not set(sha256) <= HEX:
        errors["sha256"] = "must be 64 lowercase hexadecimal digits"
    if not _whole(data.get("step")):
        errors["step"] = "must be a whole number >= 0"
    for name in ("bytes", "weights_step"):
        if data.get(name) is not None and not _whole(data[name]):
            errors[name] = "must be a whole number >= 0 or null"
    if data.get("rank") is not None and not _whole(data["rank"]):
        errors["rank"] = "must be a whole number >= 0"
    reason = data.get("reason") or CheckpointReason.MANUAL
    if reason not in CheckpointReason.values:
        errors["reason"] = f"must be one of {', '.join(CheckpointReason.values)}"
    found_set = parse_set(data["set"], errors) if data.get("set") is not None else None
    if errors:
        raise InvalidInput("The checkpoint report is not valid.", fields=errors)
    assert isinstance(path, str) and isinstance(sha256, str)  # checked above
    return CheckpointReport(
        path=path,
        sha256=sha256,
        step=data["step"],
        bytes=data.get("bytes"),
        rank=data.get("rank") or 0,
        reason=reason,
        weights_step=data.get("weights_step"),
        set=found_set,
    )


def parse_report_body(raw_body: bytes) -> CheckpointReport:
    try:
        data = json.loads(raw_body)
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("The body is not JSON.", fields={"body": "must be JSON"}) from None
    return parse_report(data)


def check_locations(job_id: int, report: CheckpointReport) -> None:
    """Every path of the report under the job's checkpoint root; 400 naming the field."""
    paths = {"path": report.path}
    if report.set is not None:
        paths["set.manifest"] = report.set.manifest
        paths.update({f"set.shards[{s['rank']}]": s["path"] for s in report.set.shards})
    checkpoint_locations(job_id, paths)


def record_checkpoint(
    job_id: int, report: CheckpointReport, *, command_id: int | None = None
) -> tuple[Checkpoint, bool]:
    """Add the checkpoint to the job's catalogue; the same path and hash again is the same row
    (the ack and the report of one brake, retries). Returns (row, created)."""
    check_locations(job_id, report)
    values: dict[str, Any] = {
        "step": report.step,
        "weights_step": report.weights_step,
        "rank": report.rank,
        "bytes": report.bytes,
        "reason": report.reason,
        "reported_at": timezone.now(),
    }
    if command_id is not None:
        values["command_id"] = command_id
    with transaction.atomic():
        # The job's row first, as an acknowledgement takes it: a rank's report and the last
        # rank's ack of the same brake insert the same row. Unlocked, the report inserted it,
        # then waited at commit on the job's row (its foreign key check) while the ack, holding
        # that row, waited on the report's uncommitted row — a deadlock torchrun jobs hit.
        Job.objects.select_for_update().filter(pk=job_id).values_list("pk", flat=True).first()
        if report.set is not None:
            values["checkpoint_set_id"] = record_set(job_id, report.step, report.set).pk
        row, created = _get_or_create(job_id, report.path, report.sha256, values)
        if not created and report.set is not None and row.checkpoint_set_id is None:
            set_id = values["checkpoint_set_id"]
            Checkpoint.objects.filter(pk=row.pk).update(checkpoint_set_id=set_id)
            row.checkpoint_set_id = set_id
        if created and not report.rank:
            # The catalogue on the job's page follows; rank 0 speaks for a set, so a job of a
            # thousand ranks sends one message per checkpoint, not a thousand.
            message = {"type": "checkpoint.reported", "job_id": job_id, "step": report.step}
            publish_after_commit(job_group(job_id), message, robust=True)
    return row, created


def _get_or_create(
    job_id: int, path: str, sha256: str, values: dict[str, Any]
) -> tuple[Checkpoint, bool]:
    try:
        with transaction.atomic():
            return Checkpoint.objects.get_or_create(
                job_id=job_id, path=path, sha256=sha256, defaults=values
            )
    except IntegrityError:  # the same report arrived twice at once: the other one won
        return Checkpoint.objects.get(job_id=job_id, path=path, sha256=sha256), False


def record_from_acknowledgement(job_id: int, command_id: int, result: dict[str, Any]) -> None:
    """A brake's ack names its checkpoint: in the catalogue, whatever else the ack says. An ack
    result that does not describe a checkpoint properly is simply not catalogued."""
    fields = {key: result.get(key) for key in REPORT_FIELDS if key in result}
    fields.setdefault("reason", CheckpointReason.BRAKE)
    try:
        report = parse_report(fields)
        check_locations(job_id, report)
    except InvalidInput:
        return
    record_checkpoint(job_id, report, command_id=command_id)


@dataclass(frozen=True)
class Lineage:
    """What "clean" is judged by: the first anomalous step of the job's latest incident, and
    the roll back carried out since its first point, if any (when, and whether what it
    restored was clean)."""

    first_step: int | None
    restored_at: datetime | None = None
    restored_clean: bool = True


def is_clean(checkpoint: Checkpoint, lineage: Lineage) -> bool:
    if lineage.first_step is None:
        return True
    if lineage.restored_at is not None and checkpoint.reported_at > lineage.restored_at:
        return lineage.restored_clean  # saved since the roll back: from the restored state
    return checkpoint.holds_updates_through < lineage.first_step


def lineage(job_id: int) -> Lineage:
    """The job's latest incident's first anomalous step, and the latest roll back the job
    carried out after that point (a resume naming a catalogue entry, acknowledged)."""
    incident = Incident.objects.filter(job_id=job_id).order_by("-opened_at", "-pk").first()
    if incident is None:
        return Lineage(None)
    roll_back = (
        Command.objects.filter(
            job_id=job_id,
            kind=CommandKind.RESUME,
            status=CommandStatus.SUCCEEDED,
            params__has_key="catalogue_id",
            acknowledged_at__gt=incident.first_time,
        )
        .order_by("-acknowledged_at", "-pk")
        .first()
    )
    if roll_back is None:
        return Lineage(incident.first_step)
    restored = Checkpoint.objects.filter(pk=roll_back.params.get("catalogue_id")).first()
    clean = restored is not None and restored.holds_updates_through < incident.first_step
    return Lineage(incident.first_step, roll_back.acknowledged_at, clean)


def catalogue(job_id: int, *, limit: int = 50) -> list[dict[str, Any]]:
    """The job's checkpoints, newest first, each marked clean or after the anomaly; the last
    clean one is ``preselected`` (what a roll back offers first). A multi-rank job's are its
    complete sets only (each as its rank-0 file with ``set``): a rank's lone file is no
    state the job can resume from."""
    judged_by = lineage(job_id)
    rows = list(catalogued(job_id).order_by("-step", "-pk")[:limit])
    allowed = checkpoints_in_root(job_id, [row.path for row in rows])
    rows = [row for row in rows if row.path in allowed]
    entries = [checkpoint_out(row, judged_by) for row in rows]
    for entry in entries:
        if entry["clean"]:
            entry["preselected"] = True
            break
    return entries


def checkpoint_out(row: Checkpoint, judged_by: Lineage) -> dict[str, Any]:
    return {
        "id": row.pk,
        "path": row.path,
        "sha256": row.sha256,
        "step": row.step,
        "weights_step": row.weights_step,
        "rank": row.rank,
        "bytes": row.bytes,
        "reason": row.reason,
        "reported_at": row.reported_at,
        "clean": is_clean(row, judged_by),
        "preselected": False,
        "set": set_out(row.checkpoint_set) if row.checkpoint_set is not None else None,
    }


def roll_back_target(job_id: int, named: str) -> Checkpoint:
    """The catalogue entry a roll back names, by id or path: 400 (field ``checkpoint``) for
    anything the job never reported, so no hand-typed path reaches the training process."""
    named = (named or "").strip()
    query = catalogued(job_id)
    found = query.filter(pk=int(named)).first() if named.isdigit() else None
    found = found or query.filter(path=named).order_by("-pk").first()
    if found is None:
        _refuse_incomplete_set(job_id, named)
        raise InvalidInput(
            "Roll back only to a checkpoint the job reported.",
            fields={"checkpoint": "not in this job's checkpoint catalogue"},
        )
    why = checkpoint_refusal(job_id, found.path)
    if why is not None:
        raise InvalidInput(f"Roll back refused: {why}.", fields={"checkpoint": why})
    return found


def roll_back_params(target: Checkpoint, skip_steps: list[int] | None = None) -> dict[str, Any]:
    """The resume's params: the SDK verifies the hash before it restores anything."""
    params: dict[str, Any] = {
        "checkpoint": target.path,
        "sha256": target.sha256,
        "step": target.step,
        "catalogue_id": target.pk,
    }
    if target.checkpoint_set is not None:
        params["set"] = set_out(target.checkpoint_set)
    if skip_steps:
        params["skip_steps"] = sorted({s for s in skip_steps if s > target.step})
    return params


# --- Checkpoint sets (multi-rank jobs) ---------------------------------------------------------

SET_FIELDS = {"manifest", "manifest_sha256", "world_size", "shards"}
SHARD_FIELDS = {"rank", "path", "bytes", "sha256"}
MAX_WORLD_SIZE = 1_000_000


def _good_path(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_PATH_LENGTH and "\x00" not in value


def _good_hash(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= HEX


def parse_set(data: Any, errors: dict[str, str]) -> SetReport | None:
    """The ``set`` object; each problem under ``set.<field>``, a shard's under
    ``set.shards[<rank>]`` — a missing rank is named, so is a rank given twice."""
    if not isinstance(data, dict):
        errors["set"] = "must be an object (manifest, manifest_sha256, world_size, shards)"
        return None
    for key in data.keys() - SET_FIELDS:
        errors[f"set.{key}"] = f"is not a field of a set ({', '.join(sorted(SET_FIELDS))})"
    if not _good_path(data.get("manifest")):
        errors["set.manifest"] = f"must be a non-empty path of at most {MAX_PATH_LENGTH} characters"
    if not _good_hash(data.get("manifest_sha256")):
        errors["set.manifest_sha256"] = "must be 64 lowercase hexadecimal digits"
    world_size, shards = data.get("world_size"), data.get("shards")
    if not _whole(world_size, 1) or world_size > MAX_WORLD_SIZE:
        errors["set.world_size"] = f"must be a whole number from 1 to {MAX_WORLD_SIZE}"
        return None
    if not isinstance(shards, list):
        errors["set.shards"] = "must be a list of every rank's file"
        return None
    by_rank = _parse_shards(shards, world_size, errors)
    if any(key.startswith("set") for key in errors):
        return None
    return SetReport(
        data["manifest"],
        data["manifest_sha256"],
        world_size,
        tuple(by_rank[r] for r in range(world_size)),
    )


def _parse_shards(shards: list, world_size: int, errors: dict[str, str]) -> dict[int, dict]:
    by_rank: dict[int, dict] = {}
    for index, shard in enumerate(shards[: world_size + 1]):
        rank = shard.get("rank") if isinstance(shard, dict) else None
        where = f"set.shards[{index}]"
        if not _whole(rank) or rank >= world_size or rank in by_rank:
            errors[where] = f"rank must be a whole number below {world_size}, each rank once"
            continue
        bad = [key for key in SHARD_FIELDS if key not in shard] + list(shard.keys() - SHARD_FIELDS)
        if bad or not _good_path(shard["path"]) or not _good_hash(shard["sha256"]):
            errors[where] = f"rank {rank}: needs rank, path, bytes and sha256 (64 hex digits)"
        elif shard["bytes"] is not None and not _whole(shard["bytes"]):
            errors[where] = f"rank {rank}: bytes must be a whole number >= 0 or null"
        by_rank[rank] = {key: shard.get(key) for key in ("rank", "path", "bytes", "sha256")}
    missing = [rank for rank in range(world_size) if rank not in by_rank]
    if missing and len(shards) <= world_size:
        named = ", ".join(map(str, missing[:8]))
        errors["set.shards"] = f"rank(s) {named} missing: a set holds every rank's file"
    elif len(shards) != world_size:
        errors["set.shards"] = f"must hold exactly {world_size} files, one per rank"
    return by_rank


def _mismatched_shard(job_id: int, report: SetReport) -> str | None:
    """A shard contradicting what its rank reported itself (same path, another hash)."""
    for shard in report.shards:
        other = (
            Checkpoint.objects.filter(job_id=job_id, rank=shard["rank"], path=shard["path"])
            .exclude(sha256=shard["sha256"])
            .values_list("sha256", flat=True)
            .first()
        )
        if other is not None:
            return (
                f"rank {shard['rank']}: its file {shard['path']} was reported with sha256 "
                f"{other}, not {shard['sha256']}"
            )
    return None


def record_set(job_id: int, step: int, report: SetReport) -> CheckpointSet:
    """Store a complete set once (and every rank's file, linked to it); 400 naming the rank
    when a shard contradicts its rank's own report or the set's size is not the job's."""
    _check_set(job_id, report)
    reported_at = timezone.now()
    values = {
        "step": step,
        "world_size": report.world_size,
        "shards": list(report.shards),
        "reported_at": reported_at,
    }
    try:
        with transaction.atomic():
            row, created = CheckpointSet.objects.get_or_create(
                job_id=job_id,
                manifest_path=report.manifest,
                manifest_sha256=report.manifest_sha256,
                defaults=values,
            )
    except IntegrityError:  # two ranks reported the same set at once
        row = CheckpointSet.objects.get(
            job_id=job_id, manifest_path=report.manifest, manifest_sha256=report.manifest_sha256
        )
        created = False
    if created:
        _store_shards(job_id, step, report, row, reported_at)
    return row


def _check_set(job_id: int, report: SetReport) -> None:
    """400 when the set's size is not the job's or a shard contradicts its rank's report."""
    world_size = Job.objects.filter(pk=job_id).values_list("world_size", flat=True).first()
    if world_size is not None and world_size != report.world_size:
        raise InvalidInput(
            "The checkpoint set is not the job's.",
            fields={"set.world_size": f"the job runs {world_size} ranks, not {report.world_size}"},
        )
    mismatch = _mismatched_shard(job_id, report)
    if mismatch is not None:
        raise InvalidInput("A shard of the set does not match.", fields={"set.shards": mismatch})


def _store_shards(
    job_id: int, step: int, report: SetReport, row: CheckpointSet, reported_at: datetime
) -> None:
    """Every other rank's file in the catalogue, linked to the set (stored before or now)."""
    for shard in report.shards[1:]:  # rank 0's row is the report's own
        fields = {
            "step": step,
            "rank": shard["rank"],
            "bytes": shard["bytes"],
            "reason": CheckpointReason.MANUAL,
            "reported_at": reported_at,
            "checkpoint_set_id": row.pk,
        }
        file, made = _get_or_create(job_id, shard["path"], shard["sha256"], fields)
        if not made and file.checkpoint_set_id is None:
            Checkpoint.objects.filter(pk=file.pk).update(checkpoint_set_id=row.pk)


def multi_rank(job_id: int) -> bool:
    world_size = Job.objects.filter(pk=job_id).values_list("world_size", flat=True).first()
    return (world_size or 1) > 1 or CheckpointSet.objects.filter(job_id=job_id).exists()


def catalogued(job_id: int) -> Any:
    """What the catalogue offers: every file of a one-process job; a multi-rank job's complete
    sets (their rank-0 files)."""
    query = Checkpoint.objects.filter(job_id=job_id).select_related("checkpoint_set")
    if multi_rank(job_id):
        query = query.filter(rank=0, checkpoint_set__isnull=False)
    return query


def set_out(found: CheckpointSet) -> dict[str, Any]:
    return {
        "id": found.pk,
        "manifest": found.manifest_path,
        "manifest_sha256": found.manifest_sha256,
        "world_size": found.world_size,
        "shards": found.shards,
    }


def _missing_ranks_text(world_size: int, present: set[int]) -> str:
    """ "1, 2, 3 and 997 more": the first missing ranks and a count, never the whole range (a
    heartbeat may report a world of 2³¹−1 ranks)."""
    named: list[str] = []
    rank = 0
    while rank < world_size and len(named) < 8:
        if rank not in present:
            named.append(str(rank))
        rank += 1
    count = world_size - sum(1 for r in present if 0 <= r < world_size)
    more = f" and {count - len(named)} more" if count > len(named) else ""
    return ", ".join(named) + more if named else "none"


def _refuse_incomplete_set(job_id: int, named: str) -> None:
    """A file of a multi-rank job outside any complete set: refused, naming what is missing."""
    query = Checkpoint.objects.filter(job_id=job_id, checkpoint_set__isnull=True)
    found = query.filter(pk=int(named)).first() if named.isdigit() else None
    found = found or query.filter(path=named).first()
    if found is None or not multi_rank(job_id):
        return
    world_size = Job.objects.get(pk=job_id).world_size or 1
    ranks = set(
        Checkpoint.objects.filter(job_id=job_id, step=found.step).values_list("rank", flat=True)
    )
    missing = _missing_ranks_text(world_size, ranks)
    raise InvalidInput(
        f"Step {found.step} is no complete checkpoint set: rank(s) {missing} missing.",
        fields={"checkpoint": f"not a complete checkpoint set (rank(s) {missing} missing)"},
    )
