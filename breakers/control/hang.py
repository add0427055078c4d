"""Which rank of a silent job hung, and which ones only wait for it (pure; table-driven tests).

In synchronous training one hung rank silences them all: the others pass the last step
boundary it passed and block, within milliseconds, in the next collective it never enters.
Their heartbeats stop too (no progress), so silence alone names every rank. What each rank
said last tells them apart: its step (the last boundary it passed) and ``sync_step``, the
latest step whose gradient sync it entered (docs/protocol.md "Heartbeats"). A rank's place
is its step, and whether it went on into the next step's collective; the ranks at the lowest
place are the ones the others wait for. A rank hung before its boundary is a step behind; one
hung inside its step's work is at the same step as the others but never entered the
collective they are in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_NAMED = 8


@dataclass(frozen=True)
class RankPlace:
    rank: int
    step: int
    sync_step: int | None = None
    host: str = ""
    pid: int | None = None

    @property
    def in_next_sync(self) -> bool:
        """It entered the gradient sync of a step beyond its last boundary: it waits there."""
        return self.sync_step is not None and self.sync_step > self.step

    @property
    def place(self) -> tuple[int, int]:
        return (self.step, 1 if self.in_next_sync else 0)


@dataclass(frozen=True)
class Hang:
    hung: tuple[RankPlace, ...]  # the ranks the others wait for
    waiting: tuple[RankPlace, ...]
    world_size: int

    def describe(self) -> str:
        """ "rank 2 of 4 is hung (gpu-3, pid 77): at step 130 it never entered step 131's
        gradient sync; ranks 0, 1, 3 wait on it in that collective" """
        many = len(self.hung) > 1
        it, verb = ("they", "are") if many else ("it", "is")
        in_sync = [w for w in self.waiting if w.in_next_sync]
        if in_sync and all(h.step == in_sync[0].step for h in self.hung):
            into = max(w.sync_step or 0 for w in in_sync)
            state = f"at step {self.hung[0].step} {it} never entered step {into}'s gradient sync"
            wait = "in that collective"
        else:
            state = f"at step {self.hung[0].step}, behind the others"
            wait = f"at step {max(w.step for w in self.waiting)}"
        hung, hosts = name_ranks(self.hung), name_hosts(self.hung)
        return (
            f"{hung} of {self.world_size:,} {verb} hung ({hosts}): "
            f"{state}; {name_ranks(self.waiting)} {'wait' if len(self.waiting) > 1 else 'waits'} "
            f"on {'them' if many else 'it'} {wait}"
        )


def name_hosts(places: Sequence[RankPlace], limit: int = MAX_NAMED) -> str:
    """One place's host and pid, else the distinct hosts, ``limit`` of them named."""
    if len(places) == 1:
        one = places[0]
        return f"{one.host or 'unknown host'}{f', pid {one.pid}' if one.pid else ''}"
    return _some(list(dict.fromkeys(p.host or "unknown host" for p in places)), limit)


def name_ranks(places: Sequence[RankPlace], limit: int = MAX_NAMED) -> str:
    """ "rank 7", "ranks 0, 1, 3", "ranks 12, 713 and 5 more": a thousand ranks in one line."""
    return rank_numbers([p.rank for p in places], limit)


def rank_numbers(ranks: Sequence[int], limit: int = MAX_NAMED) -> str:
    """``name_ranks`` of bare rank numbers, in the order given."""
    return f"rank{'s' if len(ranks) > 1 else ''} {_some([str(rank) for rank in ranks], limit)}"


def _some(names: list[str], limit: int) -> str:
    # "and 1 more" says no less than the one name it stands for: all are named then.
    if len(names) <= limit + 1:
        return ", ".join(names)
    return f"{', '.join(names[:limit])} and {len(names) - limit:,} more"


def attribute_hang(places: Sequence[RankPlace], world_size: int | None = None) -> Hang | None:
    """The ranks at the lowest place and the others; None when every rank is at the same
    place (nothing tells them apart: a collective they all wait in, a lost node or network)."""
    if len(places) < 2:
        return None
    lowest = min(p.place for p in places)
    hung = tuple(sorted((p for p in places if p.place == lowest), key=lambda p: p.rank))
    if len(hung) == len(places):
        return None
    waiting = tuple(sorted((p for p in places if p.place != lowest), key=lambda p: p.rank))
    return Hang(hung, waiting, max(world_size or 0, len(places)))
