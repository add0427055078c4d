"""Parsing and validation of what training agents send besides metrics: heartbeats and acks.

The metrics batch is parsed in :mod:`breakers.agent.points` and the JSON body decoded in
:mod:`breakers.agent.jsonbody`; their names are re-exported here, the protocol's one import
for every front door. A problem is reported with its field and why; nothing is half-stored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from breakers.agent.jsonbody import (
    MAX_JSON_DEPTH,
    DuplicateKey,
    NonFiniteLiteral,
    has_unstorable,
    is_whole_number,
    json_type,
    load_json,
    parse_json_object,
    safe_text,
    unstorable_json,
)
from breakers.agent.launcher import LAUNCHER_KEYS, LauncherIn, check_launcher
from breakers.agent.points import (
    BATCH_ID,
    DEFAULT_TIME_WINDOW_SECONDS,
    MAX_FLOAT_INT,
    MAX_NAME_LENGTH,
    MAX_RANK,
    MAX_REPORTED_ERRORS,
    MAX_STEP,
    NON_FINITE_STRINGS,
    NOT_ONE_NODE,
    POINT_KEYS,
    MetricsBatchIn,
    PointIn,
    TimeWindow,
    check_step,
    parse_metrics,
    parse_metrics_body,
)
from breakers.recovery.attribution import check_rerun
from core.errors import InvalidInput
from core.nodes import HOSTLIST_CHARACTERS

__all__ = [
    "ACK_STATUSES",
    "BATCH_ID",
    "DEFAULT_TIME_WINDOW_SECONDS",
    "HEARTBEAT_KEYS",
    "HEARTBEAT_STATUSES",
    "MAX_ERROR_LENGTH",
    "MAX_FLOAT_INT",
    "MAX_JSON_DEPTH",
    "MAX_NAME_LENGTH",
    "MAX_RANK",
    "MAX_REPORTED_ERRORS",
    "MAX_STEP",
    "NON_FINITE_STRINGS",
    "NOT_ONE_NODE",
    "POINT_KEYS",
    "PROTOCOL_VERSION",
    "AckIn",
    "DuplicateKey",
    "HeartbeatIn",
    "MetricsBatchIn",
    "NonFiniteLiteral",
    "PointIn",
    "TimeWindow",
    "has_unstorable",
    "heartbeat_from",
    "is_whole_number",
    "json_type",
    "load_json",
    "parse_ack",
    "parse_heartbeat",
    "parse_json_object",
    "parse_metrics",
    "parse_metrics_body",
    "safe_text",
    "unstorable_json",
]

# 1: the first protocol. 2: a metrics batch may carry a batch id, stored once. 3: a metrics
# batch may carry its rank's heartbeat. 4: a node's ranks' requests in one bundle, and a
# node's one websocket (docs/protocol.md "Versions"); everything of the earlier versions is
# still accepted as it was.
PROTOCOL_VERSION = 4
HEARTBEAT_STATUSES = ("running", "paused", "checkpointing", "finished", "holding")


@dataclass(frozen=True, slots=True)
class HeartbeatIn:
    step: int
    status: str
    pid: int | None
    hostname: str
    rank: int | None
    # How many ranks the job runs (WORLD_SIZE), when the rank knows it.
    world_size: int | None = None
    # The Slurm context (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_STEP_ID); "" outside Slurm.
    slurm_job_id: str = ""
    slurm_nodelist: str = ""
    slurm_step_id: str = ""
    # The launcher (torchrun's agent) the rank runs under (breakers.agent.launcher).
    launcher: LauncherIn | None = None
    # Where the rank is in its step (docs/protocol.md "Heartbeats"): the latest step whose
    # gradient sync it entered, and its own compute time per step (the wait left out).
    sync_step: int | None = None
    compute_seconds: float | None = None


HEARTBEAT_KEYS = (
    "step",
    "status",
    "pid",
    "hostname",
    "rank",
    "world_size",
    "slurm_job_id",
    "slurm_nodelist",
    "slurm_step_id",
    *LAUNCHER_KEYS,
    "sync_step",
    "compute_seconds",
)
# Slurm job ids are numbers ("123"); step ids are numbers or names ("0", "batch", "1+0").
_SLURM_JOB_ID = re.compile(r"[0-9]{1,20}")
_SLURM_STEP_ID = re.compile(r"[0-9A-Za-z+._-]{1,32}")
MAX_NODELIST_LENGTH = 1000


def _check_slurm(body: dict, errors: dict[str, str]) -> tuple[str, str, str]:
    """The optional scheduler context, as strings ("" when absent); a number is accepted too."""
    values = {}
    for key, pattern, what in (
        ("slurm_job_id", _SLURM_JOB_ID, 'a Slurm job id such as "123"'),
        ("slurm_step_id", _SLURM_STEP_ID, 'a Slurm step id such as "0" or "batch"'),
    ):
        value = body.get(key)
        value = str(value) if is_whole_number(value) and value >= 0 else value
        if value is not None and not (isinstance(value, str) and pattern.fullmatch(value)):
            errors[key] = f"must be {what}"
        values[key] = value or ""
    nodelist = _given(body, "slurm_nodelist", "")
    if not isinstance(nodelist, str) or len(nodelist) > MAX_NODELIST_LENGTH:
        errors["slurm_nodelist"] = f"must be a string of at most {MAX_NODELIST_LENGTH} characters"
    elif has_unstorable(nodelist):
        errors["slurm_nodelist"] = "must not contain NUL characters or lone surrogates"
    return values["slurm_job_id"], nodelist, values["slurm_step_id"]


def parse_heartbeat(raw: bytes) -> HeartbeatIn:
    return heartbeat_from(parse_json_object(raw))


def heartbeat_from(body: dict, field: str = "") -> HeartbeatIn:
    """A decoded heartbeat object, validated; ``field`` names where it sits in a larger body
    (``"heartbeat"`` inside a metrics batch), so each error names its whole path."""
    errors: dict[str, str] = {}
    try:
        return _heartbeat_fields(body, errors)
    except InvalidInput:
        prefix = f"{field}." if field else ""
        raise InvalidInput(
            "The heartbeat was refused.", fields={prefix + key: why for key, why in errors.items()}
        ) from None


def _heartbeat_fields(body: dict, errors: dict[str, str]) -> HeartbeatIn:
    for key in body.keys() - set(HEARTBEAT_KEYS):
        errors[safe_text(key)] = f"is not a field of a heartbeat ({', '.join(HEARTBEAT_KEYS)})"
    step = check_step(body["step"], errors, "step") if "step" in body else None
    if "step" not in body:
        errors["step"] = "is required"
    status = body.get("status")
    if status not in HEARTBEAT_STATUSES:
        errors["status"] = (
            "is required"
            if "status" not in body
            else f"must be one of {', '.join(HEARTBEAT_STATUSES)}"
        )
    pid = body.get("pid")
    if pid is not None and not (is_whole_number(pid) and 0 < pid < 2**31):
        errors["pid"] = "must be a positive whole number (the process id)"
    hostname = _given(body, "hostname", "")
    if not isinstance(hostname, str) or len(hostname) > 255:
        errors["hostname"] = "must be a string of at most 255 characters"
    elif has_unstorable(hostname):
        errors["hostname"] = "must not contain NUL characters or lone surrogates"
    elif not HOSTLIST_CHARACTERS.isdisjoint(hostname):
        errors["hostname"] = NOT_ONE_NODE
    rank = body.get("rank")
    if rank is not None and not (is_whole_number(rank) and 0 <= rank <= MAX_RANK):
        errors["rank"] = f"must be a whole number from 0 to {MAX_RANK}"
    world_size = body.get("world_size")
    if world_size is not None and not (is_whole_number(world_size) and 0 < world_size <= MAX_RANK):
        errors["world_size"] = f"must be a whole number from 1 to {MAX_RANK}"
    elif world_size is not None and "rank" not in errors and (rank or 0) >= world_size:
        errors["world_size"] = f"must be above the rank ({rank or 0}): ranks count from 0"
    slurm_job_id, slurm_nodelist, slurm_step_id = _check_slurm(body, errors)
    launcher = check_launcher(body, errors)
    sync_step, compute_seconds = _check_pace(body, errors)
    if errors:
        raise InvalidInput("The heartbeat was refused.", fields=errors)
    assert step is not None and status is not None  # or an error was written above
    return HeartbeatIn(
        step=step,
        status=status,
        pid=pid,
        hostname=hostname,
        rank=rank,
        world_size=world_size,
        slurm_job_id=slurm_job_id,
        slurm_nodelist=slurm_nodelist,
        slurm_step_id=slurm_step_id,
        launcher=launcher,
        sync_step=sync_step,
        compute_seconds=compute_seconds,
    )


MAX_COMPUTE_SECONDS = 1e6


def _check_pace(body: dict, errors: dict[str, str]) -> tuple[int | None, float | None]:
    """The optional ``sync_step`` (a step) and ``compute_seconds`` (finite, 0 to 10⁶)."""
    sync_step = body.get("sync_step")
    if sync_step is not None:
        sync_step = check_step(sync_step, errors, "sync_step")
    seconds = body.get("compute_seconds")
    if seconds is None:
        return sync_step, None
    number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
    if not (number and 0 <= seconds <= MAX_COMPUTE_SECONDS):  # NaN fails both comparisons
        errors["compute_seconds"] = f"must be a number of seconds from 0 to {MAX_COMPUTE_SECONDS:g}"
        return sync_step, None
    return sync_step, float(seconds)


@dataclass(frozen=True, slots=True)
class AckIn:
    status: str
    result: dict
    error: str


ACK_STATUSES = ("succeeded", "failed")
MAX_ERROR_LENGTH = 10_000


# The steps an acknowledgement's result may name (docs/protocol.md "Commands"): written to the
# incident's timeline and compared with the alert's steps, so each is a step or absent.
RESULT_STEP_KEYS = ("step", "restored_step", "weights_step", "apply_at_step")


def _given(body: dict, key: str, default: Any) -> Any:
    """The field, or ``default`` when it is absent or null (and only then: ``false``, ``0`` or
    ``""`` are values, checked like any other, not an absent field)."""
    value = body.get(key)
    return default if value is None else value


def _check_result_steps(result: dict, errors: dict[str, str]) -> None:
    for key in RESULT_STEP_KEYS:
        value = result.get(key)
        if value is not None and not (is_whole_number(value) and 0 <= value <= MAX_STEP):
            errors[f"result.{key}"] = f"must be a whole number from 0 to {MAX_STEP}, or null"


def parse_ack(raw: bytes) -> AckIn:
    body = parse_json_object(raw, max_depth=MAX_JSON_DEPTH)
    errors: dict[str, str] = {}
    for key in body.keys() - {"status", "result", "error"}:
        errors[safe_text(key)] = "is not a field of an acknowledgement (status, result, error)"
    status = body.get("status")
    if status not in ACK_STATUSES:
        errors["status"] = (
            "is required" if "status" not in body else f"must be one of {', '.join(ACK_STATUSES)}"
        )
    result = _given(body, "result", {})
    if not isinstance(result, dict):
        errors["result"] = f"must be an object, not {json_type(result)}"
    else:
        problem = unstorable_json(result, "result")
        if problem:
            errors[problem[0]] = problem[1]
        _check_result_steps(result, errors)
        check_rerun(result.get("rerun"), errors, max_step=MAX_STEP)
    error = _given(body, "error", "")
    if not isinstance(error, str) or len(error) > MAX_ERROR_LENGTH:
        errors["error"] = f"must be a string of at most {MAX_ERROR_LENGTH} characters"
    elif has_unstorable(error):
        errors["error"] = "must not contain NUL characters or lone surrogates"
    if errors:
        raise InvalidInput("The acknowledgement was refused.", fields=errors)
    assert status is not None  # or an error was written above
    return AckIn(status=status, result=result, error=error)
