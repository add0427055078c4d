"""Re-run to attribute, as the console hears it: the SDK re-ran a step its guard refused, on the
same batch from the unchanged pre-step state with the same generators, and says in the brake's
acknowledgement whether the non-finite value came back (``result.rerun``; docs/protocol.md).

- ``data``: it came back. The batch (or the model state it meets) gives it deterministically:
  the node is not the suspect; the batch is flagged and a roll back skips it.
- ``transient``: it did not. The same computation on the same inputs gave a finite result:
  the first one was corrupted on the node that computed it, which is flagged.

Pure (no Django): the wire check, the reading of an acknowledgement's result (one rank's, or
the ranks' summaries of a multi-rank job) and the words the incident's timeline says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DATA = "data"
TRANSIENT = "transient"
ATTRIBUTIONS = (DATA, TRANSIENT)
RERUN_KEYS = ("step", "attribution")


@dataclass(frozen=True)
class Rerun:
    """One rank's finding: the step it re-ran and what came of it."""

    step: int
    attribution: str  # DATA or TRANSIENT
    rank: int | None = None  # None: a single-process job
    node: str = ""  # the host of that rank, as its heartbeats name it (the console fills it)


def check_rerun(value: Any, errors: dict[str, str], *, max_step: int) -> None:
    """An acknowledgement's ``result.rerun``: absent or null, else exactly ``{"step": <a
    step>, "attribution": "data" | "transient"}``; each problem under its own field."""
    if value is None:
        return
    if not isinstance(value, dict):
        errors["result.rerun"] = "must be an object {step, attribution}, or null"
        return
    for key in sorted(value.keys() - set(RERUN_KEYS))[:5]:
        shown = key.encode("unicode_escape").decode("ascii")[:60]  # no NUL, no surrogate
        errors[f"result.rerun.{shown}"] = "is not a field of a re-run (step, attribution)"
    step = value.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= max_step:
        errors["result.rerun.step"] = f"must be a whole number from 0 to {max_step}"
    if value.get("attribution") not in ATTRIBUTIONS:
        errors["result.rerun.attribution"] = f"must be one of {', '.join(ATTRIBUTIONS)}"


def reported(result: dict[str, Any]) -> list[Rerun]:
    """The findings an acknowledgement's (checked) result carries, by rank: its own (rank 0's
    in a multi-rank job) and those of the ranks' summaries (``ranks``)."""
    found: dict[int | None, Rerun] = {}
    own, rank = result.get("rerun"), result.get("rank")
    if isinstance(own, dict):
        rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else None
        found[rank] = Rerun(own["step"], own["attribution"], rank)
    ranks = result.get("ranks")
    for key, summary in ranks.items() if isinstance(ranks, dict) else ():
        rerun = summary.get("rerun") if isinstance(summary, dict) else None
        if isinstance(rerun, dict) and str(key).isdigit():
            found[int(key)] = Rerun(rerun["step"], rerun["attribution"], int(key))
    return sorted(found.values(), key=lambda r: -1 if r.rank is None else r.rank)


def weighed(reruns: list[Rerun], first_step: int, last_step: int) -> Rerun | None:
    """The finding the verdict weighs, of those in the offending window: a rank whose step
    did not repeat names its node (the one fault that is not the data's), else the data."""
    inside = [r for r in reruns if first_step <= r.step <= last_step]
    transient = [r for r in inside if r.attribution == TRANSIENT]
    chosen = transient or inside
    return chosen[0] if chosen else None


def words(rerun: Rerun) -> str:
    """The timeline's row: what was re-run, what came of it, what is flagged."""
    where = f"rank {rerun.rank}" if rerun.rank is not None else "the job"
    node = f" on {rerun.node}" if rerun.node else ""
    if rerun.attribution == DATA:
        return (
            f"Batch of step {rerun.step} flagged: re-run by {where}{node} on the same batch from "
            "the same state, it gave the non-finite value again — the data (or the model), "
            "not the node"
        )
    return (
        f"Node {rerun.node or '?'} flagged: step {rerun.step}, re-run by {where} on the same "
        "batch from the same state, was finite — a transient fault of the hardware that "
        "computed it, not the data"
    )
