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

``choose_apply_at_step`` is the pure rule (table-driven tests); ``apply_at_step_for`` reads
the job's ranks.
"""

from __future__ import annotations

import math

from django.conf import settings
from django.db.models import Max

from breakers.models import CommandKind
from incidents.models import Job, JobRank

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


def choose_apply_at_step(
    highest_step: int | None,
    step_time_seconds: float | None,
    *,
    margin_seconds: float,
    world_size: int | None,
    kind: str,
) -> int | None:
    """The step at which every rank applies a ``kind`` command, or None (a single process,
    or a kind every rank takes where it is: applied at the first boundary, as ever)."""
    if (world_size or 1) <= 1 or kind not in STEP_SYNCED_KINDS:
        return None
    return max(highest_step or 0, 0) + margin_steps(step_time_seconds, margin_seconds)


def apply_at_step_for(job: Job, kind: str) -> int | None:
    """``choose_apply_at_step`` for ``job`` as its ranks last reported: the highest step of
    any rank (heartbeats) or of its metrics, the slowest rank's step time."""
    if (job.world_size or 1) <= 1 or kind not in STEP_SYNCED_KINDS:
        return None
    ranks = JobRank.objects.filter(job=job).aggregate(
        step=Max("step"), step_time=Max("step_time_seconds")
    )
    steps = [s for s in (ranks["step"], job.current_step, job.last_heartbeat_step) if s is not None]
    return choose_apply_at_step(
        max(steps, default=0),
        ranks["step_time"] or job.step_time_seconds,
        margin_seconds=settings.COMMAND_APPLY_MARGIN_SECONDS,
        world_size=job.world_size,
        kind=kind,
    )
