"""Decoding an agent's JSON body: strict, and hostile until parsed.

The body must be UTF-8 JSON without duplicate keys and nested at most a few levels; strings
carry no NUL and no lone surrogate (PostgreSQL cannot store either). The bare ``NaN`` and
``Infinity`` literals are marked (:class:`NonFiniteLiteral`) so a number too large for a float
can be told from them and refused. Every front door of the agent protocol (and the snapshot
intake) reads its body here.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, TypeGuard

from core.errors import InvalidInput

# Nesting of a body (and of an ack's result): a point is two levels deep.
MAX_JSON_DEPTH = 32
MAX_RANK = 2**31 - 1
# Characters no stored string may hold: NUL (PostgreSQL text refuses it) and lone surrogates
# (not encodable as UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


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


def printable(text: str, limit: int = 40) -> str:
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
        key = printable(duplicate.key)
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
            f"The body must be a JSON object, not {json_type(body)}.",
            fields={"body": "must be a JSON object"},
            code="malformed_json",
        )
    return body


def json_type(value: object) -> str:
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
