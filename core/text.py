"""Derived strings that fit their columns by construction.

Keys, fingerprints, titles and notification lines are built from values an agent chose (a
metric or node name of up to 200 characters). ``fit`` keeps such a string within its column:
unchanged when it fits, else a prefix followed by a short hash of the *whole* text, so two
different long inputs stay different after fitting.
"""

from __future__ import annotations

import hashlib

HASH_CHARS = 12
SEPARATOR = "~"
_TAIL = len(SEPARATOR) + HASH_CHARS


def fit(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else ``prefix~<12 hex of sha256>``
    of exactly ``limit`` characters (a limit too small for the hash gets the hash cut)."""
    if limit < 1:
        raise ValueError(f"limit must be positive, not {limit}")
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_CHARS]
    if limit <= _TAIL:
        return digest[:limit]
    return text[: limit - _TAIL] + SEPARATOR + digest
