"""Parsing and validation of what training agents send: fast, strict, and all-or-nothing.

This runs on the ingest hot path (a batch is up to 10,000 points), so it is a plain loop over
``json.loads`` output rather than a serializer per point. Every problem is reported with the
field path (``points[3].step``) and why; a batch with any problem is refused whole.
NaN and ±Inf are *data*: they arrive as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
or as the bare JSON literals (which ``json.loads`` accepts), and become floats. Nothing else
is non-finite: a number too large for a float (``1e400``, ``10**400``) is refused as out of
range, never read as infinity.

Every input is hostile until parsed: the body must be UTF-8 JSON without duplicate keys and
nested at most a few levels; strings carry no NUL and no lone surrogate (PostgreSQL cannot
store either); point times lie within ``time_window_seconds`` of the server's clock.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeGuard, cast

from breakers.agent.launcher import LAUNCHER_KEYS, LauncherIn, check_launcher
from core.errors import InvalidInput, PayloadTooLarge
from core.nodes import HOSTLIST_CHARACTERS
from core.nonfinite import DECODE

# 1: the first protocol. 2: a metrics batch may carry a batch id, stored once
# (docs/protocol.md "Versions"); everything of 1 is still accepted as it was.
PROTOCOL_VERSION = 2
MAX_NAME_LENGTH = 200
MAX_STEP = 2**63 - 1
# The largest whole number a float holds without overflowing (rounding is fine).
MAX_FLOAT_INT = int(1.7976931348623157e308)
MAX_REPORTED_ERRORS = 20
# A node is named one at a time: Slurm's host-list syntax would aim a drain at many.
NOT_ONE_NODE = "must be one node's name, not a host list (no brackets or commas)"
NON_FINITE_STRINGS = DECODE
POINT_KEYS = frozenset({"name", "step", "value", "time", "node"})
HEARTBEAT_STATUSES = ("running", "paused", "checkpointing", "finished")
# Point times further than this from the server's clock are refused (the setting
# BRAKELINE_AGENT_TIME_WINDOW_SECONDS; the service passes it).
DEFAULT_TIME_WINDOW_SECONDS = 24 * 3600.0
# Nesting of a body (and of an ack's result): a point is two levels deep.
MAX_JSON_DEPTH = 32
MAX_RANK = 2**31 - 1
# Characters no stored string may hold: NUL (PostgreSQL text refuses it) and lone surrogates
# (not encodable as UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


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
    # How many ranks the job runs (WORLD_SIZE), when the rank knows it.
    world_size: int | None = None
    # The Slurm context (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_STEP_ID); "" outside Slurm.
    slurm_job_id: str = ""
    slurm_nodelist: str = ""
    slurm_step_id: str = ""
    # The launcher (torchrun's agent) the rank runs under (breakers.agent.launcher).
    launcher: LauncherIn | None = None


class NonFiniteLiteral(float):
    """A bare ``NaN``, ``Infinity`` or ``-Infinity`` literal of the JSON text.

    ``json.loads`` also turns a number too large for a float (``1e400``) into infinity; the
    literals are marked with this type, so a plain non-finite ``float`` in parsed output can
    only be such an overflow, refused as out of range where it is used (naming its field)."""

    __slots__ = ()


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    body = dict(pairs)
    if len(body) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return body


def _depth_exceeds(value: object, limit: int) -> bool:
    stack = [(value, 1)]
    while stack:
        current, level = stack.pop()
        if level > limit:
            return True
        if type(current) is dict:
            stack.extend((item, level + 1) for item in current.values() if type(item) in _NESTED)
        elif type(current) is list:
            stack.extend((item, level + 1) for item in current if type(item) in _NESTED)
    return False


_NESTED = (dict, list)


def safe_text(text: str, limit: int = 60) -> str:
    """``text`` fit to echo in an answer: cut, NUL and lone surrogates replaced by U+FFFD."""
    return _UNSTORABLE.sub("\ufffd", text[:limit])


def _printable(text: str, limit: int = 40) -> str:
    return repr(safe_text(text, limit))


def load_json(
    raw: bytes, *, strict_constants: bool = False, max_depth: int | None = MAX_JSON_DEPTH
) -> Any:
    """``raw`` as JSON, refusing what ``json.loads`` would let through: any encoding but UTF-8,
    duplicate keys, nesting deeper than ``max_depth`` (None: only what would exhaust the
    stack; for bodies whose every field is type-checked), and with ``strict_constants`` the
    bare ``NaN``/``Infinity`` literals (else they are :class:`NonFiniteLiteral`). A number out
    of a float's range is a plain infinite ``float``: see :class:`NonFiniteLiteral`."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes | bytearray) else raw
    except UnicodeDecodeError as error:
        raise InvalidInput(
            f"The body must be JSON encoded as UTF-8 ({error.reason} at byte {error.start}).",
            fields={"body": "must be UTF-8"},
            code="malformed_json",
        ) from None
    options: dict[str, Any] = {
        "object_pairs_hook": _no_duplicates,
        "parse_constant": _refuse_constant if strict_constants else NonFiniteLiteral,
    }
    try:
        body = json.loads(text, **options)
    except DuplicateKey as duplicate:
        key = _printable(duplicate.key)
        raise InvalidInput(
            f"The body has the key {key} twice; a key may appear once per object.",
            fields={safe_text(duplicate.key): "appears twice in one object"},
            code="malformed_json",
        ) from None
    except RecursionError:
        raise _too_deep() from None
    except ValueError as error:
        raise InvalidInput(
            f"The body is not valid JSON: {error}.",
            fields={"body": "is not valid JSON"},
            code="malformed_json",
        ) from None
    if max_depth is not None and _depth_exceeds(body, max_depth):
        raise _too_deep()
    return body


def _too_deep() -> InvalidInput:
    return InvalidInput(
        f"The body is nested too deeply (at most {MAX_JSON_DEPTH} levels).",
        fields={"body": f"nested at most {MAX_JSON_DEPTH} levels"},
        code="malformed_json",
    )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"bare {name} is not JSON; send it as a string")


def parse_json_object(raw: bytes, *, max_depth: int | None = None) -> dict:
    body = load_json(raw, max_depth=max_depth)
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


def has_unstorable(text: str) -> bool:
    """NUL or a lone surrogate: what no stored string may hold."""
    return _UNSTORABLE.search(text) is not None


def _check_name(value: object, errors: dict[str, str], path: str) -> str | None:
    if not isinstance(value, str):
        errors[path] = f"must be a string, not {_json_type(value)}"
    elif has_unstorable(value):
        errors[path] = "must not contain NUL characters or lone surrogates"
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
    if type(value) is NonFiniteLiteral:
        return float(value)
    if isinstance(value, float) and math.isfinite(value):
        return value
    if isinstance(value, float) or (is_whole_number(value) and abs(value) > MAX_FLOAT_INT):
        errors[path] = (
            "is out of the range of a 64-bit float; only the strings "
            '"NaN", "Infinity" and "-Infinity" are non-finite'
        )
        return None
    if is_whole_number(value):
        return float(value)
    if isinstance(value, str) and value in NON_FINITE_STRINGS:
        return NON_FINITE_STRINGS[value]
    errors[path] = (
        f'must be a number or one of "NaN", "Infinity", "-Infinity", not {_json_type(value)}'
    )
    return None


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """The times the console accepts: ``now`` ± ``seconds`` (the server's clock)."""

    earliest: datetime
    latest: datetime
    seconds: float

    @classmethod
    def around(cls, now: datetime | None, seconds: float) -> TimeWindow:
        now = now or datetime.now(tz=UTC)
        span = timedelta(seconds=seconds)
        return cls(now - span, now + span, seconds)

    def __contains__(self, moment: datetime) -> bool:
        return self.earliest <= moment <= self.latest

    def refusal(self) -> str:
        return (
            f"must be within {self.seconds:g} seconds of the console's clock "
            f"(between {self.earliest.isoformat(timespec='seconds')} and "
            f"{self.latest.isoformat(timespec='seconds')})"
        )


def _check_time(
    value: object, errors: dict[str, str], path: str, window: TimeWindow
) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        errors[path] = f"must be an ISO 8601 string, not {_json_type(value)}"
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        errors[path] = f"{_printable(value)} is not an ISO 8601 time such as 2026-01-01T00:00:00Z"
        return None
    if parsed.tzinfo is None:
        errors[path] = "must include a time zone, such as a trailing Z for UTC"
        return None
    try:
        inside = parsed in window
    except OverflowError:
        inside = False
    if not inside:
        errors[path] = window.refusal()
        return None
    return parsed


def _check_node(value: object, errors: dict[str, str], path: str) -> str | None:
    if value is None:
        return None
    name = _check_name(value, errors, path)
    if name is not None and not HOSTLIST_CHARACTERS.isdisjoint(name):
        errors[path] = NOT_ONE_NODE
        return None
    return name


def _parse_point(
    item: object, index: int, errors: dict[str, str], window: TimeWindow
) -> PointIn | None:
    path = f"points[{index}]"
    if not isinstance(item, dict):
        errors[path] = f"must be an object, not {_json_type(item)}"
        return None
    before = len(errors)
    for key in item.keys() - POINT_KEYS:
        errors[f"{path}.{safe_text(key)}"] = (
            "is not a field of a point (name, step, value, time, node)"
        )
    for key in ("name", "step", "value"):
        if key not in item:
            errors[f"{path}.{key}"] = "is required"
    if len(errors) > before:
        return None
    name = _check_name(item["name"], errors, f"{path}.name")
    step = _check_step(item["step"], errors, f"{path}.step")
    value = _check_value(item["value"], errors, f"{path}.value")
    time = _check_time(item.get("time"), errors, f"{path}.time", window)
    node = _check_node(item.get("node"), errors, f"{path}.node")
    if len(errors) > before:
        return None
    # Each check returned its value or wrote an error, and no error was written.
    assert name is not None and step is not None and value is not None
    return PointIn(name, step, value, time, node)


def _fast_point(item: object, window: TimeWindow, names: set[str]) -> PointIn | None:
    """The common, well-formed point in a few type checks; None sends it to the slow path.

    The slow path (``_parse_point``) re-examines anything unusual and names what is wrong, so
    this function only has to be right about what it accepts, never about why it refuses.
    """
    if type(item) is not dict or not item.keys() <= POINT_KEYS:
        return None
    name, step, value = item.get("name"), item.get("step"), item.get("value")
    if type(name) is not str:
        return None
    if name not in names:  # ``names``: the names of this batch already found storable
        if not 0 < len(name) <= MAX_NAME_LENGTH or name.isspace():
            return None
        if has_unstorable(name):
            return None
        names.add(name)
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return None
    if type(value) is float:
        if value - value != 0.0:  # inf or nan: a number out of range (see NonFiniteLiteral)
            return None
    else:
        if type(value) is NonFiniteLiteral or (
            type(value) is int and -MAX_FLOAT_INT <= value <= MAX_FLOAT_INT
        ):
            value = float(cast("float", value))
        elif type(value) is str and value in NON_FINITE_STRINGS:
            value = NON_FINITE_STRINGS[value]
        else:
            return None
    node = item.get("node")
    if node is not None and (type(node) is not str or node not in names):
        if type(node) is not str or not 0 < len(node) <= MAX_NAME_LENGTH or node.isspace():
            return None
        if has_unstorable(node) or not HOSTLIST_CHARACTERS.isdisjoint(node):
            return None
        names.add(node)
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
        try:
            if time not in window:
                return None
        except OverflowError:
            return None
    return PointIn(name, step, value, time, node)


# A batch id (protocol 2): the agent's name for one batch, the same on every retry of it. The
# SDK writes "<run id>-<sequence>"; any printable id of these characters is accepted.
BATCH_ID = re.compile(r"[A-Za-z0-9._:+/-]{1,128}")


@dataclass(frozen=True, slots=True)
class MetricsBatchIn:
    points: list[PointIn]
    batch_id: str | None  # None: an agent of protocol 1 (each send is stored)


def _check_batch_id(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        problem = f"must be a string or null, not {_json_type(value)}"
    elif not BATCH_ID.fullmatch(value):
        problem = "must be 1 to 128 characters among A-Z a-z 0-9 . _ : + / -"
    else:
        return value
    raise InvalidInput("The batch id is not valid.", fields={"batch": problem})


def parse_metrics(
    raw: bytes,
    *,
    max_points: int,
    now: datetime | None = None,
    time_window_seconds: float = DEFAULT_TIME_WINDOW_SECONDS,
) -> list[PointIn]:
    """The points of a metrics batch (see parse_metrics_body)."""
    body = parse_json_object(raw)
    return parse_metrics_body(
        body, max_points=max_points, now=now, time_window_seconds=time_window_seconds
    ).points


def parse_metrics_body(
    body: dict,
    *,
    max_points: int,
    now: datetime | None = None,
    time_window_seconds: float = DEFAULT_TIME_WINDOW_SECONDS,
) -> MetricsBatchIn:
    """Validate a decoded metrics batch; raise InvalidInput / PayloadTooLarge, or return every
    point and the batch id.

    A point's ``time``, when sent, must lie within ``time_window_seconds`` of ``now`` (the
    server's clock; the current time when None)."""
    window = TimeWindow.around(now, time_window_seconds)
    extra = body.keys() - {"points", "batch"}
    if "points" not in body:
        raise InvalidInput("The body must have a 'points' array.", fields={"points": "is required"})
    if extra:
        raise InvalidInput(
            "The body has fields the protocol does not know.",
            fields={safe_text(key): "is not a field of a metrics batch" for key in sorted(extra)},
        )
    batch_id = _check_batch_id(body.get("batch"))
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
    names: set[str] = set()
    points = [_fast_point(item, window, names) for item in items]
    if None not in points:
        return MetricsBatchIn(cast("list[PointIn]", points), batch_id)
    errors: dict[str, str] = {}
    for index, item in enumerate(items):
        if points[index] is None:
            _parse_point(item, index, errors, window)
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
    "step", "status", "pid", "hostname", "rank", "world_size",
    "slurm_job_id", "slurm_nodelist", "slurm_step_id", *LAUNCHER_KEYS,
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
    elif has_unstorable(nodelist):
        errors["slurm_nodelist"] = "must not contain NUL characters or lone surrogates"
    return values["slurm_job_id"], nodelist, values["slurm_step_id"]


def parse_heartbeat(raw: bytes) -> HeartbeatIn:
    body = parse_json_object(raw)
    errors: dict[str, str] = {}
    for key in body.keys() - set(HEARTBEAT_KEYS):
        errors[safe_text(key)] = f"is not a field of a heartbeat ({', '.join(HEARTBEAT_KEYS)})"
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
    )


@dataclass(frozen=True, slots=True)
class AckIn:
    status: str
    result: dict
    error: str


ACK_STATUSES = ("succeeded", "failed")
MAX_ERROR_LENGTH = 10_000


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
    result = body.get("result") or {}
    if not isinstance(result, dict):
        errors["result"] = f"must be an object, not {_json_type(result)}"
    else:
        problem = unstorable_json(result, "result")
        if problem:
            errors[problem[0]] = problem[1]
    error = body.get("error") or ""
    if not isinstance(error, str) or len(error) > MAX_ERROR_LENGTH:
        errors["error"] = f"must be a string of at most {MAX_ERROR_LENGTH} characters"
    elif has_unstorable(error):
        errors["error"] = "must not contain NUL characters or lone surrogates"
    if errors:
        raise InvalidInput("The acknowledgement was refused.", fields=errors)
    assert status is not None  # or an error was written above
    return AckIn(status=status, result=result, error=error)


def unstorable_json(value: Any, path: str) -> tuple[str, str] | None:
    """The first thing in a JSON document that a jsonb column cannot hold, as (path, why):
    NaN/±Infinity (bare literals), numbers out of range, NUL or lone surrogates in strings
    or keys. None when everything is storable."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        current, where = stack.pop()
        if isinstance(current, dict):
            for key, item in current.items():
                if has_unstorable(key):
                    return where, "has a key with a NUL character or a lone surrogate"
                stack.append((item, f"{where}.{key}"))
        elif isinstance(current, list):
            stack.extend((item, f"{where}[{index}]") for index, item in enumerate(current))
        elif isinstance(current, float) and not math.isfinite(current):
            return where, (
                "must be a finite number here (not NaN or Infinity, nor out of the range of a "
                "64-bit float)"
            )
        elif isinstance(current, str) and has_unstorable(current):
            return where, "must not contain NUL characters or lone surrogates"
    return None
