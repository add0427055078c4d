"""Which rank an acknowledgement speaks for (multi-rank jobs, docs/protocol.md "Commands").

The SDK of a rank of a multi-rank job puts its rank into the acknowledgement's result
(``result.rank``), so consoles that predate per-rank acknowledgements still take it. Hostile
until parsed: a rank that is not a whole number in [0, 2^31) is refused with 400 naming the
field, before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.errors import InvalidInput

MAX_RANK = 2**31 - 1


def ack_rank(result: Mapping[str, Any]) -> int | None:
    """``result.rank``, or None when the acknowledgement names no rank (one process)."""
    if "rank" not in result or result["rank"] is None:
        return None
    rank = result["rank"]
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= MAX_RANK:
        raise InvalidInput(
            "The acknowledgement was refused.",
            fields={"result.rank": f"must be a whole number from 0 to {MAX_RANK}"},
        )
    return rank
