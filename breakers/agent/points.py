"""Parsing and validation of a metrics batch: fast, strict, and all-or-nothing.

This runs on the ingest hot path (a batch is up to 10,000 points), so it is a plain loop over
``json.loads`` output rather than a serializer per point. Every problem is reported with the
field path (``points[3].step``) and why; a batch with any problem is refused whole.
NaN and ±Inf are *data*: they arrive as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``
or as the bare JSON literals (which ``json.loads`` accepts), and become floats. Nothing else
is non-finite: a number too large for a float (``1e400``, ``10**400``) is refused as out of
range, never read as infinity. Point times lie within ``time_window_seconds`` of the server's
clock. A batch may carry a batch id (protocol 2), the same on every retry of it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NamedTuple, cast

from breakers.agent.jsonbody import (
    NonFiniteLiteral,
    has_unstorable,
    is_whole_number,
    json_type,
    parse_json_object,
    printable,
    safe_text,
)
from core.errors import InvalidInput, PayloadTooLarge
from core.nodes import HOSTLIST_CHARACTERS
from core.nonfinite import DECODE

MAX_NAME_LENGTH = 200
# Every step an agent sends is at most 2**53: a float8 holds it exactly (rollups compare steps
# as float8), and the console's arithmetic on it (a step plus a look-ahead, plus 50 for the
# unapplied-command check) stays far inside PostgreSQL's bigint (2**63 - 1).
MAX_STEP = 2**53
# The largest whole number a float holds without overflowing (rounding is fine).
MAX_FLOAT_INT = int(1.7976931348623157e308)
MAX_REPORTED_ERRORS = 20
# A node is named one at a time: Slurm's host-list syntax would aim a drain at many.
NOT_ONE_NODE = "must be one node's name, not a host list (no brackets or commas)"
NON_FINITE_STRINGS = DECODE
POINT_KEYS = frozenset({"name", "step", "value", "time", "node", "rank"})
MAX_RANK = 2**31 - 1
# Point times further than this from the server's clock are refused (the setting
# BRAKELINE_AGENT_TIME_WINDOW_SECONDS; the service passes it).
DEFAULT_TIME_WINDOW_SECONDS = 24 * 3600.0


class PointIn(NamedTuple):
    """One validated point. A named tuple rather than a frozen dataclass: as immutable, and
    built in a third of the time (a frozen dataclass sets each field through
    ``object.__setattr__``), which counts at a thousand points per batch."""

    name: str
    step: int
    value: float
    time: datetime | None
    node: str | None
    # The process that measured it: the point's own ``rank``, else the batch's, else 0.
    rank: int = 0


def check_name(value: object, errors: dict[str, str], path: str) -> str | None:
    if not isinstance(value, str):
        errors[path] = f"must be a string, not {json_type(value)}"
    elif has_unstorable(value):
        errors[path] = "must not contain NUL characters or lone surrogates"
    elif not value.strip():
        errors[path] = "must not be empty"
    elif len(value) > MAX_NAME_LENGTH:
        errors[path] = f"must be at most {MAX_NAME_LENGTH} characters (got {len(value)})"
    else:
        return value
    return None


def check_step(value: object, errors: dict[str, str], path: str) -> int | None:
    if not is_whole_number(value):
        errors[path] = f"must be a whole number, not {json_type(value)}"
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
        f'must be a number or one of "NaN", "Infinity", "-Infinity", not {json_type(value)}'
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
        errors[path] = f"must be an ISO 8601 string, not {json_type(value)}"
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        errors[path] = f"{printable(value)} is not an ISO 8601 time such as 2026-01-01T00:00:00Z"
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
    name = check_name(value, errors, path)
    if name is not None and not HOSTLIST_CHARACTERS.isdisjoint(name):
        errors[path] = NOT_ONE_NODE
        return None
    return name


def _check_rank(value: object, errors: dict[str, str], path: str) -> int | None:
    if is_whole_number(value) and 0 <= value <= MAX_RANK:
        return value
    errors[path] = f"must be a whole number from 0 to {MAX_RANK}"
    return None


def _parse_point(
    item: object, index: int, errors: dict[str, str], window: TimeWindow, rank: int = 0
) -> PointIn | None:
    path = f"points[{index}]"
    if not isinstance(item, dict):
        errors[path] = f"must be an object, not {json_type(item)}"
        return None
    before = len(errors)
    for key in item.keys() - POINT_KEYS:
        errors[f"{path}.{safe_text(key)}"] = (
            "is not a field of a point (name, step, value, time, node, rank)"
        )
    for key in ("name", "step", "value"):
        if key not in item:
            errors[f"{path}.{key}"] = "is required"
    if len(errors) > before:
        return None
    name = check_name(item["name"], errors, f"{path}.name")
    step = check_step(item["step"], errors, f"{path}.step")
    value = _check_value(item["value"], errors, f"{path}.value")
    time = _check_time(item.get("time"), errors, f"{path}.time", window)
    node = _check_node(item.get("node"), errors, f"{path}.node")
    if "rank" in item:
        rank = _check_rank(item["rank"], errors, f"{path}.rank") or 0
    if len(errors) > before:
        return None
    # Each check returned its value or wrote an error, and no error was written.
    assert name is not None and step is not None and value is not None
    return PointIn(name, step, value, time, node, rank)


def _fast_time(value: object, window: TimeWindow) -> datetime | None:
    """An ISO 8601 time with a zone inside the window, else None (the slow path says why)."""
    if type(value) is not str:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    try:
        return moment if moment in window else None
    except OverflowError:
        return None


def _fast_value(value: object) -> float | None:
    """A value that is not a finite float: a whole number in range, or NaN/±Inf as the
    protocol spells them; None for the rest (an infinite plain float is an overflow, see
    NonFiniteLiteral)."""
    if type(value) is NonFiniteLiteral or (
        type(value) is int and -MAX_FLOAT_INT <= value <= MAX_FLOAT_INT
    ):
        return float(cast("float", value))
    if type(value) is str and value in NON_FINITE_STRINGS:
        return NON_FINITE_STRINGS[value]
    return None


def _fast_point(
    item: object,
    window: TimeWindow,
    seen: tuple[set[str], set[str], dict[str, datetime]],
    rank: int = 0,
) -> PointIn | None:
    """The common, well-formed point in a few type checks; None sends it to the slow path.

    The slow path (``_parse_point``) re-examines anything unusual and names what is wrong, so
    this function only has to be right about what it accepts, never about why it refuses.
    """
    if type(item) is not dict or not item.keys() <= POINT_KEYS:
        return None
    # What this batch has already found storable: metric names, node names, times.
    names, nodes, times = seen
    name, step, value = item.get("name"), item.get("step"), item.get("value")
    if type(name) is not str:
        return None
    if name not in names:
        if not 0 < len(name) <= MAX_NAME_LENGTH or name.isspace():
            return None
        if has_unstorable(name):
            return None
        names.add(name)
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return None
    if type(value) is not float or value - value != 0.0:
        value = _fast_value(value)
        if value is None:
            return None
    node = item.get("node")
    if node is not None and (type(node) is not str or node not in nodes):
        if type(node) is not str or not 0 < len(node) <= MAX_NAME_LENGTH or node.isspace():
            return None
        if has_unstorable(node) or not HOSTLIST_CHARACTERS.isdisjoint(node):
            return None
        nodes.add(node)  # apart from ``names``: a name may hold what a node name may not
    time = item.get("time")
    if time is not None:
        # A training step stamps all its metrics alike: a batch holds few distinct times.
        parsed = times.get(time) if type(time) is str else None
        if parsed is None:
            parsed = _fast_time(time, window)
            if parsed is None:
                return None
            times[time] = parsed
        time = parsed
    if "rank" in item:
        rank = item["rank"]
        if type(rank) is not int or not 0 <= rank <= MAX_RANK:
            return None
    return PointIn(name, step, value, time, node, rank)


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
        problem = f"must be a string or null, not {json_type(value)}"
    elif not BATCH_ID.fullmatch(value):
        problem = "must be 1 to 128 characters among A-Z a-z 0-9 . _ : + / -"
    else:
        return value
    raise InvalidInput("The batch id is not valid.", fields={"batch": problem})


def _batch_rank(value: object) -> int:
    """The batch's ``rank`` (the sending process's): the default of its points' ranks."""
    errors: dict[str, str] = {}
    rank = _check_rank(value, errors, "rank")
    if rank is None:
        raise InvalidInput("The batch's rank is not valid.", fields=errors)
    return rank


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
    extra = body.keys() - {"points", "batch", "rank"}
    if "points" not in body:
        raise InvalidInput("The body must have a 'points' array.", fields={"points": "is required"})
    if extra:
        raise InvalidInput(
            "The body has fields the protocol does not know.",
            fields={safe_text(key): "is not a field of a metrics batch" for key in sorted(extra)},
        )
    batch_id = _check_batch_id(body.get("batch"))
    rank = _batch_rank(body.get("rank", 0))
    items = body["points"]
    if not isinstance(items, list):
        raise InvalidInput(
            "'points' must be an array.",
            fields={"points": f"must be an array, not {json_type(items)}"},
        )
    if len(items) > max_points:
        raise PayloadTooLarge(
            f"A batch holds at most {max_points} points; this one has {len(items)}. "
            "Split it into smaller batches.",
            fields={"points": f"at most {max_points} points"},
        )
    seen: tuple[set[str], set[str], dict[str, datetime]] = (set(), set(), {})
    points = [_fast_point(item, window, seen, rank) for item in items]
    if None not in points:
        return MetricsBatchIn(cast("list[PointIn]", points), batch_id)
    errors: dict[str, str] = {}
    for index, item in enumerate(items):
        if points[index] is None:
            _parse_point(item, index, errors, window, rank)
        if len(errors) >= MAX_REPORTED_ERRORS:
            break
    if errors:
        raise InvalidInput(
            f"The batch was refused whole: {len(errors)} problem(s) found"
            f"{' (only the first ones are listed)' if len(errors) >= MAX_REPORTED_ERRORS else ''}.",
            fields=errors,
        )
    raise AssertionError("the fast path refused a point that the slow path accepts")
