"""One step for all ranks: at which step boundary a multi-rank job applies a command.

A command that changes the training state reaches a job's ranks at different moments (one
over its websocket within milliseconds, another in its next metrics or heartbeat reply). Were
each rank to apply it at its first boundary after it arrived, ranks of one job would stop at
different steps, one holding while the others wait inside a collective. So the console names
the step: above the highest step any rank has reported, plus a margin of
``COMMAND_APPLY_MARGIN_SECONDS`` worth of the job's measured step time, time enough for the
command to reach every rank. Every rank applies it exactly there (docs/protocol.md "Commands";
the SDK's ranks also agree at that boundary through their process group, so a rank the
command reached late still holds at the same step).

``choose_apply_at_step`` and ``projected_step`` are the pure rules (table-driven tests);
``apply_at_step_for`` reads the job's ranks. A rank's last heartbeat is up to an interval
old: its step is projected to now at its measured step time, or a fast job's apply step would
be behind it before the command left.

Gathering the holds: a NaN poisons every rank's all-reduced gradients, so every rank's guard
holds at the same step, but their "holding" heartbeats reach the console over a fraction of a
second, node by node, and the first node's offending point is evaluated before the last
node's hold has landed. Named then, the brake would take the margin and release the held
ranks to train past the anomaly. So the evaluator waits for them: a brake of a multi-rank
job some but not all of whose ranks hold is not issued until every rank holds or
``HOLD_GATHER_SECONDS`` have passed since the evaluator first waited (a rank that died
holds never: the brake then takes the margin). ``hold_gather_wait`` is that rule (pure).
"""

from __future__ import annotations

import math
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from breakers.agent.points import MAX_STEP
from breakers.models import CommandKind
from incidents.models import AgentStatus, Job, JobRank

# What changes the training state: applied by every rank at the same step. A resume is taken
# where the ranks hold (the same step already); isolate_node is the executor's.
STEP_SYNCED_KINDS = frozenset(
    {
        CommandKind.LOWER_LR,
        CommandKind.PAUSE_DATA,
        CommandKind.CHECKPOINT_AND_PAUSE,
        CommandKind.TERMINATE,
    }
)
# Bounds of the margin in steps: at least two boundaries ahead (the highest reported step may
# already be behind the fastest rank); at most this many (a step time measured during a stall
# must not put the brake hours away); with no measured step time yet, this many.
MIN_MARGIN_STEPS = 2
MAX_MARGIN_STEPS = 1000
UNMEASURED_MARGIN_STEPS = 20


def margin_steps(step_time_seconds: float | None, margin_seconds: float) -> int:
    """How many steps ahead: ``margin_seconds`` of steps, within the bounds."""
    if step_time_seconds is None or not math.isfinite(step_time_seconds) or step_time_seconds <= 0:
        return UNMEASURED_MARGIN_STEPS
    wanted = math.ceil(margin_seconds / step_time_seconds)
    return max(MIN_MARGIN_STEPS, min(MAX_MARGIN_STEPS, wanted))


def projected_step(step: int, seconds_since_report: float, step_time_seconds: float | None) -> int:
    """Where a rank that reported ``step`` that many seconds ago is now, at its measured
    pace: a heartbeat is up to an interval old, and a fast job is many steps further on."""
    if (
        step_time_seconds is None
        or not math.isfinite(step_time_seconds)
        or step_time_seconds <= 0
        or seconds_since_report <= 0
    ):
        return step
    ahead = min(MAX_MARGIN_STEPS, math.floor(seconds_since_report / step_time_seconds))
    return min(step + ahead, MAX_STEP)


def choose_apply_at_step(
    highest_step: int | None,
    step_time_seconds: float | None,
    *,
    margin_seconds: float,
    world_size: int | None,
    kind: str,
    every_rank_holds: bool = False,
) -> int | None:
    """The step at which every rank applies a ``kind`` command, or None (a single process,
    or a kind every rank takes where it is: applied at the first boundary, as ever). When
    every rank holds (its step guard refused an update and it waits for this decision), at
    the step they hold: no margin, or they would train that many steps past the anomaly."""
    if (world_size or 1) <= 1 or kind not in STEP_SYNCED_KINDS:
        return None
    if every_rank_holds:
        return min(max(highest_step or 0, 0), MAX_STEP)
    # Capped at the last step the protocol knows: a rank that reported 2⁶³−1 (a legal step)
    # must still be brakable, and no bigint column holds one step more.
    ahead = max(highest_step or 0, 0) + margin_steps(step_time_seconds, margin_seconds)
    return min(ahead, MAX_STEP)


def hold_gather_wait(
    world_size: int | None, holding: int, waited: float | None, bound: float
) -> float:
    """Seconds a brake still waits for the job's other ranks to hold, 0 to issue it now:
    ``holding`` of ``world_size`` ranks say they hold, and the evaluator has waited
    ``waited`` seconds for the rest (None: not yet). No rank holding is a job whose guard
    did not stop it (or no guard): nothing to wait for; every rank holding, nothing left."""
    if bound <= 0 or (world_size or 1) <= 1 or holding <= 0 or holding >= (world_size or 1):
        return 0.0
    if waited is None:
        return bound
    return max(0.0, bound - max(waited, 0.0))


def hold_gather_seconds(job: Job, waiting_since: datetime | None, now: datetime) -> float:
    """``hold_gather_wait`` for ``job`` as its ranks' rows say now (read only for a brake
    about to be issued, never for an ordinary evaluation)."""
    if (job.world_size or 1) <= 1 or settings.HOLD_GATHER_SECONDS <= 0:
        return 0.0
    holding = JobRank.objects.filter(job_id=job.pk, status=AgentStatus.HOLDING).count()
    waited = None if waiting_since is None else (now - waiting_since).total_seconds()
    return hold_gather_wait(job.world_size, holding, waited, settings.HOLD_GATHER_SECONDS)


def apply_at_step_for(job: Job, kind: str, now: datetime | None = None) -> int | None:
    """``choose_apply_at_step`` for ``job`` as its ranks last reported: the highest step any
    rank is at by now (its last heartbeat's step, projected at its own step time; or the
    job's metrics), the slowest rank's step time for the margin."""
    if (job.world_size or 1) <= 1 or kind not in STEP_SYNCED_KINDS:
        return None
    now = now or timezone.now()
    ranks = list(
        JobRank.objects.filter(job=job).values_list(
            "step", "last_heartbeat_at", "step_time_seconds", "status"
        )
    )
    holding = [step for step, _, _, status in ranks if status == AgentStatus.HOLDING]
    if holding and len(holding) >= (job.world_size or 1):
        # Every rank waits at its guard's step: the ranks hold at one step (the process group
        # keeps them in lockstep), and no step is taken past it before the decision.
        return choose_apply_at_step(
            max(holding),
            None,
            margin_seconds=0.0,
            world_size=job.world_size,
            kind=kind,
            every_rank_holds=True,
        )
    steps = [
        # A holding rank is where it says: it takes no step until it hears from us.
        step
        if status == AgentStatus.HOLDING
        else projected_step(step, (now - at).total_seconds(), step_time)
        for step, at, step_time, status in ranks
    ]
    steps += [s for s in (job.current_step, job.last_heartbeat_step) if s is not None]
    step_times: list[float | None] = [t for _, _, t, _ in ranks if t] or [job.step_time_seconds]
    return choose_apply_at_step(
        max(steps, default=0),
        max((t for t in step_times if t is not None), default=None),
        margin_seconds=settings.COMMAND_APPLY_MARGIN_SECONDS,
        world_size=job.world_size,
        kind=kind,
    )
