"""Turning what ``run.log`` queued into protocol points (JSON text, one point per line).

This runs in the background sender thread, never in the training thread: converting tensors
with ``float()`` (a device sync for accelerator tensors) and formatting timestamps is kept off the
training loop's path.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("brakeline")

# The protocol's limits for a point: refused points would make the console refuse the batch.
MAX_NAME_LENGTH = 200
NONFINITE_LOSS = "nonfinite.loss"
NONFINITE_GRAD = "nonfinite.grad"


@dataclasses.dataclass
class LogRecord:
    """One ``run.log`` call, as captured in the training thread (cheap references only)."""

    step: int
    time: float
    metrics: Mapping[str, Any]
    # Counts taken from a NonFiniteCounter at log time; may be device tensors (read later).
    loss_nonfinite: Any = None
    loss_observed: int = 0
    grad_nonfinite: Any = None


def json_value(value: float) -> float | str:
    """A protocol value: finite floats as numbers, NaN/Infinity/-Infinity as strings."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def to_jsonable(value: Any) -> Any:
    """A structure strict JSON can encode: non-finite floats as strings, unknowns as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return json_value(value)
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_jsonable(item) for item in value]
    try:
        return json_value(to_float(value))
    except (TypeError, ValueError, RuntimeError):
        return str(value)


def format_time(epoch_seconds: float) -> str:
    """ISO 8601 in UTC with a Z suffix, microsecond precision."""
    moment = datetime.datetime.fromtimestamp(epoch_seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_float(value: Any) -> float:
    """float() of numbers, 0-d tensors and NumPy scalars; raises TypeError/ValueError otherwise."""
    if isinstance(value, (bool, int, float)):
        return float(value)
    if hasattr(value, "numel") and value.numel() != 1:
        raise ValueError(f"tensor with {value.numel()} elements is not a scalar")
    return float(value)


def is_loss_name(name: str) -> bool:
    """Metric names counted as losses for ``nonfinite.loss``: 'loss', 'train/loss', 'val_loss'."""
    last = name.replace("/", ".").rsplit(".", 1)[-1]
    return "loss" in last.lower() and not name.startswith("nonfinite.")


def encode_point(name: str, step: int, value: float, time: str, node: str) -> str:
    point = {"name": name, "step": step, "value": json_value(value), "time": time, "node": node}
    return json.dumps(point, separators=(",", ":"), allow_nan=False)


def _value_json(value: float) -> str:
    # What json.dumps writes for a finite float (its repr), and the protocol's strings else.
    if value - value == 0.0:  # finite: inf - inf and nan - nan are nan
        return repr(value)
    return '"NaN"' if value != value else ('"Infinity"' if value > 0 else '"-Infinity"')


# Names seen per run are few (tens); the caches stop growing past this many anyway.
MAX_CACHED_NAMES = 10_000


class RecordExpander:
    """Expands LogRecords into encoded points. Owned by the sender thread (not thread-safe).

    The output is exactly :func:`encode_point`'s, built from cached pieces: this thread shares
    the host (and, on SMT cores, the very core) with the training thread, so every
    microsecond it spends per point is one the training loop may feel.
    """

    def __init__(self, node: str) -> None:
        self.node = node
        self._node_json = json.dumps(node)
        self._names: dict[str, tuple[str, bool]] = {}  # name -> (JSON text, is a loss name)
        self._warned_names: set[str] = set()

    def expand(self, record: LogRecord) -> list[str]:
        try:
            step = int(record.step)
        except (TypeError, ValueError):
            step = -1
        if step < 0:
            self._warn_once(
                f"step:{record.step!r}",
                "brakeline: step %r is not a whole number >= 0; its metrics are skipped",
                record.step,
            )
            return []
        values = self._convert(record.metrics)
        self._add_nonfinite_counts(record, values)
        tail = f',"time":"{format_time(record.time)}","node":{self._node_json}}}'
        head = '{"name":'
        middle = f',"step":{step},"value":'
        return [
            head + self._name(name)[0] + middle + _value_json(value) + tail
            for name, value in values.items()
        ]

    def _name(self, name: str) -> tuple[str, bool]:
        known = self._names.get(name)
        if known is None:
            known = (json.dumps(name), is_loss_name(name))
            if len(self._names) < MAX_CACHED_NAMES:
                self._names[name] = known
        return known

    def _convert(self, metrics: Mapping[str, Any]) -> dict[str, float]:
        values: dict[str, float] = {}
        for name, raw in metrics.items():
            name = str(name)
            if not name.strip() or len(name) > MAX_NAME_LENGTH:
                self._warn_once(
                    name,
                    "brakeline: metric name %r is empty or longer than %d characters; skipped",
                    name[:60],
                    MAX_NAME_LENGTH,
                )
                continue
            try:
                values[name] = to_float(raw)
            except (TypeError, ValueError, RuntimeError) as error:
                self._warn_once(
                    name, "brakeline: metric %r is not a number, skipped (%s)", name, error
                )
        return values

    def _warn_once(self, key: str, message: str, *arguments: Any) -> None:
        if key not in self._warned_names:
            self._warned_names.add(key)
            logger.warning(message, *arguments)

    def _add_nonfinite_counts(self, record: LogRecord, values: dict[str, float]) -> None:
        # A forward hook that saw the model's own loss outputs is authoritative: frameworks such
        # as the HF Trainer replace a NaN loss before it is ever logged.
        if record.loss_observed:
            values[NONFINITE_LOSS] = to_float(record.loss_nonfinite)
        else:
            losses = [value for name, value in values.items() if self._name(name)[1]]
            if losses and NONFINITE_LOSS not in values:
                values[NONFINITE_LOSS] = float(sum(not math.isfinite(v) for v in losses))
        if record.grad_nonfinite is not None:
            values[NONFINITE_GRAD] = to_float(record.grad_nonfinite)
