"""The one wire spelling of non-finite numbers — pure Python, no Django.

JSON has no NaN or ±Infinity, and to Brakeline they are data (a NaN loss is what the brake
is for), so every JSON it reads or writes — the agent protocol, the REST API, the live
pages — spells them as the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``.
(The SDK, its own distribution, has its own copy: the protocol is the contract between them.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

# The strings agents may send for a value, and what they mean.
DECODE: Mapping[str, float] = MappingProxyType(
    {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
)


def spell(value: float) -> str:
    """The wire spelling of a non-finite ``value`` (ValueError for a finite one)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    raise ValueError(f"{value!r} is finite")


def encode(value: float | None) -> float | str | None:
    """A value for strict JSON: finite numbers and None as they are, the rest spelled."""
    if value is None or math.isfinite(value):
        return value
    return spell(value)


def decode(raw: Any) -> float:
    """A value as JSON carries it: a number (not a boolean), or one of the spellings."""
    if isinstance(raw, bool):
        raise ValueError("a metric value must be a number, not a boolean")
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str) and raw in DECODE:
        return DECODE[raw]
    raise ValueError(f"a metric value must be a number, 'NaN', 'Infinity' or '-Infinity': {raw!r}")
