"""The pure rules of multi-rank commands: at which step every rank applies one
(breakers.control.apply_at), and what the ranks' acknowledgements add up to
(breakers.control.acks.tally). Table-driven, no database."""

from __future__ import annotations

import math

import pytest

from breakers.agent.points import MAX_STEP
from breakers.control.acks import AnswerCount, RankAnswer, Verdict, tally, tally_counts
from breakers.control.apply_at import (
    MAX_MARGIN_STEPS,
    MIN_MARGIN_STEPS,
    UNMEASURED_MARGIN_STEPS,
    choose_apply_at_step,
    hold_gather_wait,
    margin_steps,
    projected_step,
)


@pytest.mark.parametrize(
    ("world", "holding", "waited", "bound", "expected"),
    [
        # Some ranks hold, the others' holds are on their way: wait, the bound at most.
        (4, 2, None, 2.0, 2.0),  # the first look: the whole bound
        (4, 2, 0.5, 2.0, 1.5),
        (1000, 999, 1.9, 2.0, 0.1),
        # Every rank holds: at once, at the held step.
        (4, 4, None, 2.0, 0.0),
        (4, 4, 0.5, 2.0, 0.0),
        (4, 5, 0.5, 2.0, 0.0),  # a stale seat above a shrunk world size
        # The bound has passed (a rank that never holds: died, or its guard did not trip).
        (4, 3, 2.0, 2.0, 0.0),
        (4, 3, 3600.0, 2.0, 0.0),
        # No rank holds: no guard stopped the job (a NaN loss seen first, no SDK guard).
        (4, 0, None, 2.0, 0.0),
        # One process, or an unknown world: nothing to gather.
        (1, 1, None, 2.0, 0.0),
        (None, 1, None, 2.0, 0.0),
        # Waiting turned off.
        (4, 2, None, 0.0, 0.0),
        # A console clock that stepped back: the wait never exceeds the bound.
        (4, 2, -5.0, 2.0, 2.0),
    ],
)
def test_a_brake_awaits_the_ranks_holds_within_the_bound(world, holding, waited, bound, expected):
    assert hold_gather_wait(world, holding, waited, bound) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("highest", "step_time", "margin", "world", "kind", "expected"),
    [
        # Several ranks, a kind that changes the training state: margin seconds of steps.
        (100, 0.04, 3.0, 2, "checkpoint_and_pause", 175),
        (100, 0.5, 3.0, 8, "lower_lr", 106),
        (100, 0.03, 1.0, 4, "terminate", 134),  # ceil(33.3)
        (100, 0.5, 3.0, 2, "pause_data", 106),
        # Slow steps: never less than MIN_MARGIN_STEPS ahead.
        (100, 60.0, 3.0, 2, "checkpoint_and_pause", 100 + MIN_MARGIN_STEPS),
        # A tiny measured step time (a stall just ended): bounded.
        (100, 1e-6, 3.0, 2, "checkpoint_and_pause", 100 + MAX_MARGIN_STEPS),
        # No step time yet, or an unusable one.
        (7, None, 3.0, 2, "checkpoint_and_pause", 7 + UNMEASURED_MARGIN_STEPS),
        (7, 0.0, 3.0, 2, "checkpoint_and_pause", 7 + UNMEASURED_MARGIN_STEPS),
        (7, math.nan, 3.0, 2, "checkpoint_and_pause", 7 + UNMEASURED_MARGIN_STEPS),
        (7, -1.0, 3.0, 2, "checkpoint_and_pause", 7 + UNMEASURED_MARGIN_STEPS),
        # Nothing reported yet.
        (None, 0.1, 1.0, 2, "lower_lr", 10),
        # One process: the first boundary, as ever.
        (100, 0.04, 3.0, 1, "checkpoint_and_pause", None),
        (100, 0.04, 3.0, None, "checkpoint_and_pause", None),
        # Taken where the ranks are: a resume (they hold at one step), the executor's kinds.
        (100, 0.04, 3.0, 4, "resume", None),
        (100, 0.04, 3.0, 4, "isolate_node", None),
        # A rank at the last step a bigint holds (a legal report) or just below it: the
        # brake is still applied, at that step, never one past it.
        (MAX_STEP, 0.04, 3.0, 2, "checkpoint_and_pause", MAX_STEP),
        (MAX_STEP - 5, 0.04, 3.0, 2, "terminate", MAX_STEP),
    ],
)
def test_the_apply_step_is_above_every_rank_by_the_margin(
    highest, step_time, margin, world, kind, expected
):
    chosen = choose_apply_at_step(
        highest, step_time, margin_seconds=margin, world_size=world, kind=kind
    )
    assert chosen == expected


@pytest.mark.parametrize("step_time", [1e-9, 0.001, 0.04, 1.0, 30.0, 1e9])
def test_the_margin_is_always_within_its_bounds(step_time):
    assert MIN_MARGIN_STEPS <= margin_steps(step_time, 3.0) <= MAX_MARGIN_STEPS


@pytest.mark.parametrize(
    ("step", "seconds", "step_time", "expected"),
    [
        (100, 1.0, 0.1, 110),  # a heartbeat 1 s old, 10 steps a second
        (100, 0.05, 0.1, 100),  # not a whole step yet
        (100, 0.0, 0.1, 100),
        (100, -2.0, 0.1, 100),  # a clock step backwards projects nothing
        (100, 5.0, None, 100),  # no pace measured
        (100, 5.0, 0.0, 100),
        (100, 5.0, math.inf, 100),
        (100, 1e6, 0.001, 100 + MAX_MARGIN_STEPS),  # a long silence is not a long projection
        (MAX_STEP - 3, 1.0, 0.1, MAX_STEP),  # never past the last step a bigint holds
    ],
)
def test_a_ranks_step_is_projected_to_now_at_its_pace(step, seconds, step_time, expected):
    assert projected_step(step, seconds, step_time) == expected


S, F = "succeeded", "failed"


TALLY_CASES = [
    (2, {}, Verdict("waiting", missing=(0, 1), missing_count=2)),
    (2, {0: RankAnswer(S, 40)}, Verdict("waiting", missing=(1,), missing_count=1)),
    # A world of 2³¹−1 ranks (a legal heartbeat): counted, the first sixteen named, never
    # listed whole (it was a 70 GB tuple).
    (
        2**31 - 1,
        {0: RankAnswer(S, 4), 2: RankAnswer(S, 4)},
        Verdict("waiting", missing=(1, *range(3, 18)), missing_count=2**31 - 3),
    ),
    (2, {0: RankAnswer(S, 40), 1: RankAnswer(S, 40)}, Verdict(S)),
    (1, {0: RankAnswer(S, 3)}, Verdict(S)),
    # A rank that failed fails the command at once, named.
    (
        3,
        {0: RankAnswer(S, 40), 2: RankAnswer(F, 40)},
        Verdict(F, missing=(1,), failed=(2,), missing_count=1),
    ),
    # Different steps: split, even before the last rank answers.
    (
        3,
        {0: RankAnswer(S, 131), 1: RankAnswer(S, 132)},
        Verdict(F, missing=(2,), split_steps={131: (0,), 132: (1,)}, missing_count=1),
    ),
    (
        4,
        {r: RankAnswer(S, 132 if r else 131) for r in range(4)},
        Verdict(F, split_steps={131: (0,), 132: (1, 2, 3)}),
    ),
    # An answer without a step counts as its own step (-1): it cannot vouch for the same.
    (
        2,
        {0: RankAnswer(S, 5), 1: RankAnswer(S, None)},
        Verdict(F, split_steps={-1: (1,), 5: (0,)}),
    ),
    # A world that shrank: an answer of a rank it no longer has counts for no rank.
    (
        2,
        {0: RankAnswer(S, 7), 3: RankAnswer(S, 7)},
        Verdict("waiting", missing=(1,), missing_count=1),
    ),
    (2, {0: RankAnswer(S, 7), 1: RankAnswer(S, 7), 3: RankAnswer(S, 7)}, Verdict(S)),
    (2, {0: RankAnswer(S, 7), 3: RankAnswer(F, 7)}, Verdict(F, (1,), (3,), missing_count=1)),
]


@pytest.mark.parametrize(("world", "answers", "expected"), TALLY_CASES)
def test_every_rank_at_the_same_step_or_it_is_not_done(world, answers, expected):
    assert tally(world, answers) == expected


@pytest.mark.parametrize(("world", "answers", "expected"), TALLY_CASES)
def test_the_answers_counted_by_status_and_step_make_the_same_status(world, answers, expected):
    """``tally_counts``: what a waiting command's new acknowledgement decides on, from the
    answers counted (as the database groups them) instead of read."""
    counts: dict[tuple[str, int | None], list[int]] = {}
    for rank, answer in answers.items():
        count = counts.setdefault((answer.status, answer.step), [0, 0])
        count[0] += 1
        count[1] += 0 <= rank < world
    counted = [
        AnswerCount(status, step, n, inside) for (status, step), (n, inside) in counts.items()
    ]
    assert tally_counts(world, counted) == expected.status


@pytest.mark.parametrize(
    ("held", "world", "kind", "expected"),
    [
        (15, 2, "checkpoint_and_pause", 15),  # every rank holds at 15: applied right there
        (15, 4, "terminate", 15),
        (MAX_STEP, 2, "checkpoint_and_pause", MAX_STEP),
        (15, 1, "checkpoint_and_pause", None),  # one process: its first boundary, as ever
        (15, 2, "resume", None),
    ],
)
def test_where_every_rank_holds_the_brake_is_applied_at_the_held_step(held, world, kind, expected):
    chosen = choose_apply_at_step(
        held, 0.04, margin_seconds=3.0, world_size=world, kind=kind, every_rank_holds=True
    )
    assert chosen == expected
