"""Parsing and validation of what training agents send: fast, strict, and all-or-nothing.

This runs on the ingest hot path (a batch is up to 10,000 points), so it is a plain loop over
``json.loads`` output rather than a serializer per point. Every problem is reported with the
field path (``points[3].step``) and why; a batch with any problem is refused whole.
NaN and ±Inf are *data*: they arrive as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
or as the bare JSON literals (which ``json.loads`` accepts), and become floats.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import TypeGuard, cast

from core.errors import InvalidInput, PayloadTooLarge
from core.nonfinite import DECODE

MAX_NAME_LENGTH = 200
MAX_STEP = 2**63 - 1
MAX_REPORTED_ERRORS = 20
NON_FINITE_STRINGS = DECODE
POINT_KEYS = frozenset({"name", "step", "value", "time", "node"})
HEARTBEAT_STATUSES = ("running", "paused", "checkpointing", "finished")


@dataclass(frozen=True, slots=True)
class PointIn:
    name: str
    step: int
    value: float
    time: datetime | None
    node: str | None


@dataclass(frozen=True, slots=True)
class HeartbeatIn:
    step: int
    status: str
    pid: int | None
    hostname: str
    rank: int | None
    # The Slurm context (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_STEP_ID); "" outside Slurm.
    slurm_job_id: str = ""
    slurm_nodelist: str = ""
    slurm_step_id: str = ""


def parse_json_object(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidInput(f"The body is not valid JSON: {error}.", code="malformed_json") from None
    if not isinstance(body, dict):
        raise InvalidInput(
            f"The body must be a JSON object, not {_json_type(body)}.", code="malformed_json"
        )
    return body


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def is_whole_number(value: object) -> TypeGuard[int]:
    # bool is a subclass of int in Python but `true` is not a step in JSON.
    return isinstance(value, int) and not isinstance(value, bool)


def _check_name(value: object, errors: dict[str, str], path: str) -> str | None:
    if not isinstance(value, str):
        errors[path] = f"must be a string, not {_json_type(value)}"
    elif not value.strip():
        errors[path] = "must not be empty"
    elif len(value) > MAX_NAME_LENGTH:
        errors[path] = f"must be at most {MAX_NAME_LENGTH} characters (got {len(value)})"
    else:
        return value
    return None


def _check_step(value: object, errors: dict[str, str], path: str) -> int | None:
    if not is_whole_number(value):
        errors[path] = f"must be a whole number, not {_json_type(value)}"
    elif value < 0:
        errors[path] = f"must not be negative (got {value})"
    elif value > MAX_STEP:
        errors[path] = f"must be at most {MAX_STEP}"
    else:
        return value
    return None


def _check_value(value: object, errors: dict[str, str], path: str) -> float | None:
    if isinstance(value, float):
        return value
    if is_whole_number(value):
        return float(value)
    if isinstance(value, str) and value in NON_FINITE_STRINGS:
        return NON_FINITE_STRINGS[value]
    errors[path] = (
        f'must be a number or one of "NaN", "Infinity", "-Infinity", not {_json_type(value)}'
    )
    return None


def _check_time(value: object, errors: dict[str, str], path: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        errors[path] = f"must be an ISO 8601 string, not {_json_type(value)}"
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        errors[path] = f"{value[:40]!r} is not an ISO 8601 time such as 2026-01-01T00:00:00Z"
        return None
    if parsed.tzinfo is None:
        errors[path] = "must include a time zone, such as a trailing Z for UTC"
        return None
    return parsed


def _check_node(value: object, errors: dict[str, str], path: str) -> str | None:
    if value is None:
        return None
    return _check_name(value, errors, path)


def _parse_point(item: object, index: int, errors: dict[str, str]) -> PointIn | None:
    path = f"points[{index}]"
    if not isinstance(item, dict):
        errors[path] = f"must be an object, not {_json_type(item)}"
        return None
    before = len(errors)
    for key in item.keys() - POINT_KEYS:
        errors[f"{path}.{key}"] = "is not a field of a point (name, step, value, time, node)"
    for key in ("name", "step", "value"):
        if key not in item:
            errors[f"{path}.{key}"] = "is required"
    if len(errors) > before:
        return None
    name = _check_name(item["name"], errors, f"{path}.name")
    step = _check_step(item["step"], errors, f"{path}.step")
    value = _check_value(item["value"], errors, f"{path}.value")
    time = _check_time(item.get("time"), errors, f"{path}.time")
    node = _check_node(item.get("node"), errors, f"{path}.node")
    if len(errors) > before:
        return None
    # Each check returned its value or wrote an error, and no error was written.
    assert name is not None and step is not None and value is not None
    return PointIn(name, step, value, time, node)


def _fast_point(item: object) -> PointIn | None:
    """The common, well-formed point in a few type checks; None sends it to the slow path.

    The slow path (``_parse_point``) re-examines anything unusual and names what is wrong, so
    this function only has to be right about what it accepts, never about why it refuses.
    """
    if type(item) is not dict or not item.keys() <= POINT_KEYS:
        return None
    name, step, value = item.get("name"), item.get("step"), item.get("value")
    if type(name) is not str or not 0 < len(name) <= MAX_NAME_LENGTH or name.isspace():
        return None
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return None
    if type(value) is not float:
        if type(value) is int:
            value = float(value)
        elif type(value) is str and value in NON_FINITE_STRINGS:
            value = NON_FINITE_STRINGS[value]
        else:
            return None
    node = item.get("node")
    if node is not None and (
        type(node) is not str or not 0 < len(node) <= MAX_NAME_LENGTH or node.isspace()
    ):
        return None
    time = item.get("time")
    if time is not None:
        if type(time) is not str:
            return None
        try:
            time = datetime.fromisoformat(time)
        except ValueError:
            return None
        if time.tzinfo is None:
            return None
    return PointIn(name, step, value, time, node)


def parse_metrics(raw: bytes, *, max_points: int) -> list[PointIn]:
    """Validate a metrics batch; raise InvalidInput / PayloadTooLarge, or return every point."""
    body = parse_json_object(raw)
    extra = body.keys() - {"points"}
    if "points" not in body:
        raise InvalidInput("The body must have a 'points' array.", fields={"points": "is required"})
    if extra:
        raise InvalidInput(
            "The body has fields the protocol does not know.",
            fields={key: "is not a field of a metrics batch" for key in sorted(extra)},
        )
    items = body["points"]
    if not isinstance(items, list):
        raise InvalidInput(
            "'points' must be an array.",
            fields={"points": f"must be an array, not {_json_type(items)}"},
        )
    if len(items) > max_points:
        raise PayloadTooLarge(
            f"A batch holds at most {max_points} points; this one has {len(items)}. "
            "Split it into smaller batches.",
            fields={"points": f"at most {max_points} points"},
        )
    points = [_fast_point(item) for item in items]
    if None not in points:
        return cast("list[PointIn]", points)
    errors: dict[str, str] = {}
    for index, item in enumerate(items):
        if points[index] is None:
            _parse_point(item, index, errors)
        if len(errors) >= MAX_REPORTED_ERRORS:
            break
    if errors:
        raise InvalidInput(
            f"The batch was refused whole: {len(errors)} problem(s) found"
            f"{' (only the first ones are listed)' if len(errors) >= MAX_REPORTED_ERRORS else ''}.",
            fields=errors,
        )
    raise AssertionError("the fast path refused a point that the slow path accepts")


HEARTBEAT_KEYS = (
    "step", "status", "pid", "hostname", "rank", "slurm_job_id", "slurm_nodelist", "slurm_step_id",
)  # fmt: skip
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
    nodelist = body.get("slurm_nodelist") or ""
    if not isinstance(nodelist, str) or len(nodelist) > MAX_NODELIST_LENGTH:
        errors["slurm_nodelist"] = f"must be a string of at most {MAX_NODELIST_LENGTH} characters"
    return values["slurm_job_id"], nodelist, values["slurm_step_id"]


def parse_heartbeat(raw: bytes) -> HeartbeatIn:
    body = parse_json_object(raw)
    errors: dict[str, str] = {}
    for key in body.keys() - set(HEARTBEAT_KEYS):
        errors[key] = f"is not a field of a heartbeat ({', '.join(HEARTBEAT_KEYS)})"
    step = _check_step(body["step"], errors, "step") if "step" in body else None
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
    hostname = body.get("hostname") or ""
    if not isinstance(hostname, str) or len(hostname) > 255:
        errors["hostname"] = "must be a string of at most 255 characters"
    rank = body.get("rank")
    if rank is not None and not (is_whole_number(rank) and rank >= 0):
        errors["rank"] = "must be a non-negative whole number"
    slurm_job_id, slurm_nodelist, slurm_step_id = _check_slurm(body, errors)
    if errors:
        raise InvalidInput("The heartbeat was refused.", fields=errors)
    assert step is not None and status is not None  # or an error was written above
    return HeartbeatIn(
        step=step,
        status=status,
        pid=pid,
        hostname=hostname,
        rank=rank,
        slurm_job_id=slurm_job_id,
        slurm_nodelist=slurm_nodelist,
        slurm_step_id=slurm_step_id,
    )


@dataclass(frozen=True, slots=True)
class AckIn:
    status: str
    result: dict
    error: str


ACK_STATUSES = ("succeeded", "failed")
MAX_ERROR_LENGTH = 10_000


def parse_ack(raw: bytes) -> AckIn:
    body = parse_json_object(raw)
    errors: dict[str, str] = {}
    for key in body.keys() - {"status", "result", "error"}:
        errors[key] = "is not a field of an acknowledgement (status, result, error)"
    status = body.get("status")
    if status not in ACK_STATUSES:
        errors["status"] = (
            "is required" if "status" not in body else f"must be one of {', '.join(ACK_STATUSES)}"
        )
    result = body.get("result") or {}
    if not isinstance(result, dict):
        errors["result"] = f"must be an object, not {_json_type(result)}"
    error = body.get("error") or ""
    if not isinstance(error, str) or len(error) > MAX_ERROR_LENGTH:
        errors["error"] = f"must be a string of at most {MAX_ERROR_LENGTH} characters"
    if errors:
        raise InvalidInput("The acknowledgement was refused.", fields=errors)
    assert status is not None  # or an error was written above
    return AckIn(status=status, result=result, error=error)
