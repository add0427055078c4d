"""The checkpoint catalogue: recording what jobs report, judging it clean, naming a roll back.

Every front door uses these: the agent's report (``POST /api/v1/agent/checkpoints``), the
acknowledgement of a brake (``checkpoint_and_pause``), the job and incident pages, and the
confirmation of a pause that rolls back (only a catalogue entry can be named).

*Clean*, seen from an incident: the checkpoint's weights hold no optimizer update from the
incident's first anomalous step on (``weights_step < first_step``; without ``weights_step``,
its ``step``). The SDK's step guard skips the update of a non-finite step, so the brake's own
checkpoint is usually clean; without the guard it is "after the anomaly".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from breakers.models import Checkpoint, CheckpointReason
from core.errors import InvalidInput
from incidents.models import Incident

MAX_PATH_LENGTH = 4096
MAX_STEP = 2**62
REPORT_FIELDS = {"path", "sha256", "step", "bytes", "rank", "reason", "weights_step"}
HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class CheckpointReport:
    path: str
    sha256: str
    step: int
    bytes: int | None = None
    rank: int = 0
    reason: str = CheckpointReason.MANUAL
    weights_step: int | None = None


def _whole(value: Any, low: int = 0) -> bool:
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
    )


def parse_report_body(raw_body: bytes) -> CheckpointReport:
    try:
        data = json.loads(raw_body)
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("The body is not JSON.", fields={"body": "must be JSON"}) from None
    return parse_report(data)


def record_checkpoint(
    job_id: int, report: CheckpointReport, *, command_id: int | None = None
) -> tuple[Checkpoint, bool]:
    """Add the checkpoint to the job's catalogue; the same path and hash again is the same row
    (the ack and the report of one brake, retries). Returns (row, created)."""
    values = {
        "step": report.step,
        "weights_step": report.weights_step,
        "rank": report.rank,
        "bytes": report.bytes,
        "reason": report.reason,
        "reported_at": timezone.now(),
    }
    if command_id is not None:
        values["command_id"] = command_id
    try:
        with transaction.atomic():
            return Checkpoint.objects.get_or_create(
                job_id=job_id, path=report.path, sha256=report.sha256, defaults=values
            )
    except IntegrityError:  # the same report arrived twice at once: the other one won
        return Checkpoint.objects.get(job_id=job_id, path=report.path, sha256=report.sha256), False


def record_from_acknowledgement(job_id: int, command_id: int, result: dict[str, Any]) -> None:
    """A brake's ack names its checkpoint: in the catalogue, whatever else the ack says. An ack
    result that does not describe a checkpoint properly is simply not catalogued."""
    fields = {key: result.get(key) for key in REPORT_FIELDS if key in result}
    fields.setdefault("reason", CheckpointReason.BRAKE)
    try:
        report = parse_report(fields)
    except InvalidInput:
        return
    record_checkpoint(job_id, report, command_id=command_id)


def is_clean(checkpoint: Checkpoint, anomaly_step: int | None) -> bool:
    return anomaly_step is None or checkpoint.holds_updates_through < anomaly_step


def anomaly_step(job_id: int) -> int | None:
    """The first anomalous step of the job's latest incident (what "clean" is judged by)."""
    incident = Incident.objects.filter(job_id=job_id).order_by("-opened_at", "-pk").first()
    return incident.first_step if incident is not None else None


def catalogue(job_id: int, *, limit: int = 50) -> list[dict[str, Any]]:
    """The job's checkpoints, newest first, each marked clean or after the anomaly; the last
    clean one is ``preselected`` (what a roll back offers first)."""
    first_step = anomaly_step(job_id)
    rows = list(Checkpoint.objects.filter(job_id=job_id).order_by("-step", "-pk")[:limit])
    entries = [checkpoint_out(row, first_step) for row in rows]
    for entry in entries:
        if entry["clean"]:
            entry["preselected"] = True
            break
    return entries


def checkpoint_out(row: Checkpoint, first_step: int | None) -> dict[str, Any]:
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
        "clean": is_clean(row, first_step),
        "preselected": False,
    }


def roll_back_target(job_id: int, named: str) -> Checkpoint:
    """The catalogue entry a roll back names, by id or path: 400 (field ``checkpoint``) for
    anything the job never reported, so no hand-typed path reaches the training process."""
    named = (named or "").strip()
    query = Checkpoint.objects.filter(job_id=job_id)
    found = query.filter(pk=int(named)).first() if named.isdigit() else None
    found = found or query.filter(path=named).order_by("-pk").first()
    if found is None:
        raise InvalidInput(
            "Roll back only to a checkpoint the job reported.",
            fields={"checkpoint": "not in this job's checkpoint catalogue"},
        )
    return found


def roll_back_params(target: Checkpoint, skip_steps: list[int] | None = None) -> dict[str, Any]:
    """The resume's params: the SDK verifies the hash before it restores anything."""
    params: dict[str, Any] = {
        "checkpoint": target.path,
        "sha256": target.sha256,
        "step": target.step,
        "catalogue_id": target.pk,
    }
    if skip_steps:
        params["skip_steps"] = sorted({s for s in skip_steps if s > target.step})
    return params
