"""Straggler scores of a job's ranks, as plain data (no framework: tested table-driven).

A rank's score is its time per step — its own compute time when the SDK reports it, else its
step interval — relative to the fastest rank's now (``vs_fastest``) and to its
own usual step time (``vs_usual``, a slow moving average of what it measured before). Under
data parallelism every rank waits for the slowest at each all_reduce, so one slow rank (a
throttling GPU, a noisy neighbour, a bad link) costs the whole job its share; it is flagged
once it is ``SLOW`` (20 %) slower than either, and no longer once it is back within
``CLEAR`` (10 %): the gap between the two keeps a rank on the edge from flapping.
"""

from __future__ import annotations

from dataclasses import dataclass

SLOW = 1.2  # flag a rank 20 % slower than the fastest rank or than its own usual pace
CLEAR = 1.1  # ... and clear it once it is back within 10 %
USUAL_SMOOTHING = 0.05  # the usual pace: an exponential average over ~20 checks
MIN_USUAL_SAMPLES = 5  # its own history counts once it has this many checks behind it


@dataclass(frozen=True)
class RankPace:
    """One rank as the check sees it: now, and its history so far."""

    rank: int
    host: str
    step_time: float  # seconds per step now (the rank's heartbeat average)
    usual: float | None = None  # its usual step time (None: no history yet)
    samples: int = 0  # checks behind ``usual``
    flagged: bool = False  # flagged at the previous check
    # What ``step_time`` is: "compute", the rank's own work per step (the wait for the other
    # ranks left out), or "step", the interval between its steps.
    basis: str = "step"


@dataclass(frozen=True)
class Score:
    rank: int
    host: str
    step_time: float
    vs_fastest: float | None  # None: a single rank has no peer
    fastest_rank: int | None
    vs_usual: float | None  # None: not enough history
    straggler: bool
    basis: str = "step"

    def describe(self) -> str:
        parts = []
        if self.vs_fastest is not None:
            parts.append(
                f"{_percent(self.vs_fastest)} slower than the fastest rank ({self.fastest_rank})"
            )
        if self.vs_usual is not None:
            parts.append(f"{_percent(self.vs_usual)} slower than its own usual pace")
        where = f" on {self.host}" if self.host else ""
        what = "of its own compute per step" if self.basis == "compute" else "per step"
        return f"rank {self.rank}{where}: {self.step_time:.3g} s {what}, " + ", ".join(parts)


def _percent(ratio: float) -> str:
    return f"{(ratio - 1) * 100:.0f} %"


def _usable(seconds: float | None) -> bool:
    return seconds is not None and seconds > 0 and seconds == seconds and seconds < float("inf")


def scores(ranks: list[RankPace]) -> list[Score]:
    """Every rank's score; ``straggler`` with hysteresis (SLOW to flag, CLEAR to let go)."""
    timed = [r for r in ranks if _usable(r.step_time)]
    fastest = min(timed, key=lambda r: (r.step_time, r.rank), default=None)
    out = []
    for rank in timed:
        vs_fastest = None
        if fastest is not None and len(timed) > 1:
            vs_fastest = rank.step_time / fastest.step_time
        vs_usual = None
        if _usable(rank.usual) and rank.samples >= MIN_USUAL_SAMPLES:
            vs_usual = rank.step_time / rank.usual  # type: ignore[operator]
        limit = CLEAR if rank.flagged else SLOW
        slow = any(ratio is not None and ratio >= limit for ratio in (vs_fastest, vs_usual))
        out.append(
            Score(
                rank.rank,
                rank.host,
                rank.step_time,
                vs_fastest,
                None if fastest is None else fastest.rank,
                vs_usual,
                slow,
                rank.basis,
            )
        )
    return sorted(out, key=lambda s: s.rank)


def next_usual(rank: RankPace, straggler: bool) -> tuple[float, int]:
    """The usual pace after this check: a straggler's slow steps are not learnt as usual
    (else a rank that stays slow would soon look normal to itself)."""
    if not _usable(rank.step_time) or straggler:
        return (rank.usual or 0.0), rank.samples
    if not _usable(rank.usual):
        return rank.step_time, 1
    assert rank.usual is not None
    usual = (1 - USUAL_SMOOTHING) * rank.usual + USUAL_SMOOTHING * rank.step_time
    return usual, rank.samples + 1
