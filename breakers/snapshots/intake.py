"""Environment snapshots from training agents: strict validation, then one row per snapshot.

Body: ``{"kind": "start" | "checkpoint" | "resume", "step": N, "snapshot": {...},
"checkpoint": {"path": "...", "sha256": "<64 hex>", "bytes": N}}`` — ``checkpoint`` is
required for kind=checkpoint (the checkpoint written) and kind=resume (the one resumed from,
whose snapshot it is then diffed against: ``breakers.snapshots.resume``), refused for
kind=start. The snapshot document itself is open (an agent in
another language may record more), but the sections the console reads are type-checked, and it
is bounded in size (:data:`MAX_SNAPSHOT_BYTES`, 413 above) and in depth.

Secrets: the agent redacts them (the SDK replaces them with ``"<redacted>"``). The console
also *refuses* (400, ``unredacted_secret``) a snapshot in which a key naming a secret (a word
of it is, or ends with, TOKEN, SECRET, PASSWORD or KEY) holds a non-empty value other than a
redaction marker, or an environment value carries a URL password. Refusing rather than
redacting on arrival is deliberate: the document is all-or-nothing like a metrics batch, the
error tells the agent's author that their agent leaks secrets (a server that quietly redacted
would hide that), and nothing of the secret is ever written — not even to the error, which
names the field, never the value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from breakers.agent.protocol import (
    DEFAULT_TIME_WINDOW_SECONDS,
    MAX_STEP,
    TimeWindow,
    is_whole_number,
    load_json,
    safe_text,
    unstorable_json,
)
from breakers.models import EnvironmentSnapshot, SnapshotKind
from breakers.models.snapshots import KINDS_WITH_CHECKPOINT
from breakers.snapshots.diff import accelerators_seen
from breakers.snapshots.resume import check_resume
from core.errors import InvalidInput, PayloadTooLarge
from incidents.job_size import report_job_size
from incidents.models import JobRank

# A snapshot with every installed package of a large environment is ~50 KB; 1 MiB leaves
# room for any real one and keeps a runaway agent from filling the table.
MAX_SNAPSHOT_BYTES: int = getattr(settings, "AGENT_MAX_SNAPSHOT_BYTES", 1024 * 1024)
MAX_DEPTH = 16
MAX_PATH_LENGTH = 4096
REDACTION_MARKERS = frozenset({"<redacted>", "[redacted]", "redacted", "***", "********"})
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY")
# Sections the console reads, and the JSON type each must have when present.
SECTION_TYPES: dict[str, type | tuple[type, ...]] = {
    "packages": dict,
    "environment": dict,
    "seeds": dict,
    "git": dict,
    "image": dict,
    "scheduler": dict,
    "resources": dict,
    "python": dict,
    "platform": dict,
    "sdk": dict,
    "data_position": (dict, type(None)),
    "taken_at": str,
    "schema": int,
    "hardware": dict,
    "sandbox": dict,
}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.\-]*://[^:/@\s]+:(?P<password>[^@/\s]+)@", re.I)


@dataclass(frozen=True)
class SnapshotIn:
    kind: str
    step: int
    taken_at: datetime | None
    data: dict
    checkpoint_path: str
    checkpoint_sha256: str


def _load(raw: bytes) -> dict:
    if len(raw) > MAX_SNAPSHOT_BYTES:
        raise PayloadTooLarge(
            f"A snapshot holds at most {MAX_SNAPSHOT_BYTES} bytes; this one has {len(raw)}.",
            fields={"snapshot": f"at most {MAX_SNAPSHOT_BYTES} bytes"},
        )
    # Strict JSON: a bare NaN would be stored as invalid JSON in PostgreSQL's jsonb. UTF-8
    # only, no duplicate keys, bounded nesting (breakers.agent.protocol.load_json).
    body = load_json(raw, strict_constants=True)
    if not isinstance(body, dict):
        raise InvalidInput("The body must be a JSON object.", code="malformed_json")
    return body


def is_secret_key(name: str) -> bool:
    """HF_TOKEN, WANDB_API_KEY, db_password, clientSecret — not TOKENIZERS_PARALLELISM or
    keyring: a word of the name must be, or end with, a secret word (plural allowed).

    The same rule as the SDK's ``brakeline.snapshot.is_secret_name`` (whose list of words is
    longer), so whatever this refuses the SDK has already redacted."""
    words = [word for word in re.split(r"[_\-.\s]+", name.upper()) if word]
    return any(
        word.endswith(secret) or word.rstrip("S").endswith(secret)
        for word in words
        for secret in SECRET_WORDS
    )


def _is_unredacted(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and value not in REDACTION_MARKERS


def find_unredacted_secrets(data: Any, path: str = "snapshot", depth: int = 0) -> list[str]:
    """Paths of values that look like secrets sent in clear (never the values themselves)."""
    if depth > MAX_DEPTH:
        return []
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            child = f"{path}.{key}"
            if path == "snapshot" and key == "packages":
                continue  # distribution names (keyring, monkeytype) and versions: not secrets
            if is_secret_key(str(key)) and _is_unredacted(value):
                found.append(child)
            elif isinstance(value, str) and path == "snapshot.environment":
                passwords = (match["password"] for match in _URL_PASSWORD.finditer(value))
                if any(password not in REDACTION_MARKERS for password in passwords):
                    found.append(child)
            else:
                found.extend(find_unredacted_secrets(value, child, depth + 1))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            found.extend(find_unredacted_secrets(item, f"{path}[{index}]", depth + 1))
    return found


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        current, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(current, dict):
            stack.extend((item, level + 1) for item in current.values())
        elif isinstance(current, list):
            stack.extend((item, level + 1) for item in current)
    return deepest


def _check_snapshot(snapshot: Any, errors: dict[str, str], window: TimeWindow) -> datetime | None:
    """Type-check the sections the console reads; returns the agent's taken_at, if any."""
    if not isinstance(snapshot, dict):
        errors["snapshot"] = "is required and must be an object"
        return None
    if _depth(snapshot) > MAX_DEPTH:
        errors["snapshot"] = f"must be nested at most {MAX_DEPTH} levels deep"
        return None
    problem = unstorable_json(snapshot, "snapshot")
    if problem is not None:
        errors[problem[0][:200]] = problem[1]
        return None
    for section, expected in SECTION_TYPES.items():
        value = snapshot.get(section)
        # bool is an int in Python, but `true` is not a schema version in JSON.
        if section in snapshot and (not isinstance(value, expected) or isinstance(value, bool)):
            errors[f"snapshot.{section}"] = "has the wrong JSON type"
    for section in ("packages", "environment"):
        values = snapshot.get(section)
        if isinstance(values, dict) and not all(isinstance(v, str) for v in values.values()):
            errors[f"snapshot.{section}"] = "must map names to strings"
    taken_at = snapshot.get("taken_at")
    if not isinstance(taken_at, str):
        return None
    try:
        parsed = datetime.fromisoformat(taken_at)
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        errors["snapshot.taken_at"] = "must be an ISO 8601 time with a time zone"
        return None
    try:
        inside = parsed in window
    except OverflowError:
        inside = False
    if not inside:
        errors["snapshot.taken_at"] = window.refusal()
        return None
    return parsed


def _check_checkpoint(kind: Any, checkpoint: Any, errors: dict[str, str]) -> tuple[str, str]:
    if kind not in KINDS_WITH_CHECKPOINT:
        if checkpoint is not None:
            errors["checkpoint"] = "is only sent with kind 'checkpoint' or 'resume'"
        return "", ""
    if not isinstance(checkpoint, dict):
        errors["checkpoint"] = f"is required for kind {kind!r}: an object with path, sha256"
        return "", ""
    for key in checkpoint.keys() - {"path", "sha256", "bytes"}:
        errors[f"checkpoint.{key}"] = "is not a field of a checkpoint (path, sha256, bytes)"
    path, sha256 = checkpoint.get("path"), checkpoint.get("sha256")
    if isinstance(path, str) and unstorable_json(path, "checkpoint.path"):
        errors["checkpoint.path"] = "must not contain NUL characters or lone surrogates"
    elif not isinstance(path, str) or not path.strip() or len(path) > MAX_PATH_LENGTH:
        errors["checkpoint.path"] = f"must be a non-empty string of at most {MAX_PATH_LENGTH}"
    if not isinstance(sha256, str) or not _SHA256.match(sha256):
        errors["checkpoint.sha256"] = "must be 64 lowercase hexadecimal digits"
    size = checkpoint.get("bytes")
    if size is not None and not (is_whole_number(size) and size >= 0):
        errors["checkpoint.bytes"] = "must be a whole number >= 0"
    return str(path or ""), str(sha256 or "")


def parse_snapshot(
    raw: bytes,
    *,
    now: datetime | None = None,
    time_window_seconds: float = DEFAULT_TIME_WINDOW_SECONDS,
) -> SnapshotIn:
    """Validate a snapshot body; raise InvalidInput / PayloadTooLarge, or return it. Its
    ``taken_at``, when sent, must lie within ``time_window_seconds`` of ``now``."""
    window = TimeWindow.around(now, time_window_seconds)
    body = _load(raw)
    errors: dict[str, str] = {}
    for key in body.keys() - {"kind", "step", "snapshot", "checkpoint"}:
        errors[safe_text(key)] = (
            "is not a field of a snapshot upload (kind, step, snapshot, checkpoint)"
        )
    kind = body.get("kind")
    if kind not in SnapshotKind.values:
        errors["kind"] = f"must be one of {', '.join(SnapshotKind.values)}"
    step = body.get("step")
    if not (is_whole_number(step) and 0 <= step <= MAX_STEP):
        errors["step"] = "is required: a whole number >= 0"
    taken_at = _check_snapshot(body.get("snapshot"), errors, window)
    path, sha256 = _check_checkpoint(kind, body.get("checkpoint"), errors)
    if errors:
        raise InvalidInput("The snapshot was refused.", fields=errors)
    leaked = find_unredacted_secrets(body["snapshot"])
    if leaked:
        raise InvalidInput(
            "The snapshot holds values that look like secrets sent in clear; redact them "
            "(replace the value with '<redacted>') before sending. Nothing was stored.",
            fields={path_: "looks like an unredacted secret" for path_ in leaked[:20]},
            code="unredacted_secret",
        )
    assert isinstance(kind, str) and is_whole_number(step)  # or an error was written above
    return SnapshotIn(kind, step, taken_at, body["snapshot"], path, sha256)


def record_snapshot(job_id: int, raw_body: bytes) -> tuple[EnvironmentSnapshot, bool]:
    """Validate and store one snapshot of the job; (row, created). The same snapshot sent
    again (an agent retrying after a lost answer) returns the row stored the first time."""
    snapshot = parse_snapshot(
        raw_body,
        time_window_seconds=getattr(
            settings, "AGENT_TIME_WINDOW_SECONDS", DEFAULT_TIME_WINDOW_SECONDS
        ),
    )
    fields = {
        "job_id": job_id,
        "kind": snapshot.kind,
        "step": snapshot.step,
        "taken_at": snapshot.taken_at or timezone.now(),
    }
    try:
        with transaction.atomic():
            row = EnvironmentSnapshot.objects.create(
                **fields,
                data=snapshot.data,
                checkpoint_path=snapshot.checkpoint_path,
                checkpoint_sha256=snapshot.checkpoint_sha256,
            )
            if row.kind == SnapshotKind.RESUME:
                # Once per stored resume (a retried upload is the IntegrityError below).
                check_resume(row)
            _report_size(job_id, snapshot.data)
    except IntegrityError:
        return EnvironmentSnapshot.objects.get(**fields), False
    return row, True


def _report_size(job_id: int, data: dict[str, Any]) -> None:
    """The job's size as its own reports tell it: the hosts its ranks heartbeat from, and the
    accelerators the snapshot's process saw on its host (one launcher per host, each host
    alike). Nothing is reported for a job that saw no accelerator: it occupies none."""
    names = accelerators_seen(data)
    if not names:
        return
    hosts = JobRank.objects.filter(job_id=job_id).exclude(hostname="")
    nodes = hosts.values("hostname").distinct().count()
    name = next((n for n in names if isinstance(n, str)), "")
    report_job_size(job_id, nodes=max(1, nodes), per_node=len(names), accelerator=name)
