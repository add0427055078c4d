"""The verdict with history: after an automatic L3 brake, recover, stop, isolate, or hold.

Pure (no Django), so every caller gets the same answer and the table is tested in
milliseconds. The evidence is what the console knows when the brake's checkpoint is confirmed:
which rule braked, the offending step window, the rank and node, the job's earlier automatic
recoveries, whether a hardware signal names the node, the budget, and whether a clean
checkpoint exists, and what re-running the refused step found where the SDK did
(``breakers.recovery.attribution``). Two rules that point at the same runbook entry (the
loss's NaN and the step guard's refused update both point at ``nan-inf``) are one cause. The
first matching row of the table decides; every fact that weighs is listed in the reasons, so
the incident and the review say why.

| evidence (first match wins)                           | verdict          |
|-------------------------------------------------------|------------------|
| the rule's policy is "hold for a person"              | HOLD             |
| a drill sandbox (not a drill of the recovery path),   | HOLD             |
| or a person took over or acted                        |                  |
| a hardware signal on the node                         | ISOLATE_AND_PAGE |
| the step's re-run was finite (transient: the node)    | ISOLATE_AND_PAGE |
| the step window overlaps an earlier recovery's        | STOP_AND_PAGE    |
| the same cause recovered before, too little progress  | STOP_AND_PAGE    |
| the budget (recoveries per job per hour) is spent     | STOP_AND_PAGE    |
| no clean checkpoint to roll back to                   | STOP_AND_PAGE    |
| more steps to skip than the policy allows             | STOP_AND_PAGE    |
| otherwise                                             | RECOVER          |

A re-run that repeated the non-finite value (``data``) moves no row: it is why a RECOVER that
skips the batch is the right answer, and the reasons say so, the batch flagged.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from breakers.recovery.attribution import DATA, TRANSIENT, Rerun

HOLD_POLICY = "hold"
RECOVER_POLICY = "recover"
POLICIES = (HOLD_POLICY, RECOVER_POLICY)
DEFAULT_BUDGET = 3  # automatic recoveries per job per hour
MAX_BUDGET = 100


class Verdict(enum.StrEnum):
    RECOVER = "recover"
    STOP_AND_PAGE = "stop_and_page"
    ISOLATE_AND_PAGE = "isolate_and_page"
    HOLD = "hold"


@dataclass(frozen=True)
class EarlierRecovery:
    """An automatic recovery the job went through before (its verdict was RECOVER)."""

    cause: str
    first_step: int
    last_step: int  # the window's last step: the brake's step


@dataclass(frozen=True)
class Evidence:
    rule_key: str
    cause: str  # what the rule points at: its runbook entry (nan-inf), else its key
    policy: str  # HOLD_POLICY or RECOVER_POLICY
    budget: int  # at most this many automatic recoveries per job per hour
    first_step: int  # the offending window: the anomaly's first step ...
    last_step: int  # ... to the step the brake held at
    rank: int | None = None
    node: str = ""
    earlier: Sequence[EarlierRecovery] = ()  # this job's automatic recoveries, oldest first
    recoveries_last_hour: int = 0
    hardware_signals: Sequence[str] = ()  # e.g. "dcgm-xid on gpu-b (L2, firing)"
    clean_checkpoint_step: int | None = None  # the last clean checkpoint's step, if any
    min_progress_steps: int = 10  # healthy steps after a recovery that count as progress
    max_skip_steps: int = 100  # a wider window is not a batch to skip: a person looks
    drill: bool = False
    # The sandbox of a drill of the recovery path: the table goes on as for a real job.
    drill_of_recovery: bool = False
    taken_over_by: str = ""  # who took over from the machine, and how (empty: nobody)
    rerun: Rerun | None = None  # what re-running the refused step found (None: not re-run)


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reasons: tuple[str, ...] = field(default_factory=tuple)


def _where(evidence: Evidence) -> str:
    window = (
        f"step {evidence.first_step}"
        if evidence.first_step == evidence.last_step
        else f"steps {evidence.first_step}–{evidence.last_step}"
    )
    rank = f", rank {evidence.rank}" if evidence.rank is not None else ""
    node = f" on {evidence.node}" if evidence.node else ""
    return f"rule {evidence.rule_key} at {window}{rank}{node}"


def _overlapping(evidence: Evidence) -> EarlierRecovery | None:
    for earlier in reversed(evidence.earlier):
        if evidence.first_step <= earlier.last_step and earlier.first_step <= evidence.last_step:
            return earlier
    return None


def _same_cause_without_progress(evidence: Evidence) -> tuple[EarlierRecovery, int] | None:
    """The latest earlier recovery of the same rule, and the healthy steps trained since its
    window, when they are fewer than the progress the policy asks for."""
    same = [e for e in evidence.earlier if e.cause == evidence.cause]
    if not same:
        return None
    latest = same[-1]
    progress = evidence.first_step - latest.last_step - 1
    if progress < evidence.min_progress_steps:
        return latest, max(progress, 0)
    return None


def _stop(evidence: Evidence) -> str | None:
    """Why the run must stop and a person be paged, or None."""
    overlap = _overlapping(evidence)
    if overlap is not None:
        return (
            f"the same step window ({overlap.first_step}–{overlap.last_step}) was recovered "
            "automatically before: never twice"
        )
    repeat = _same_cause_without_progress(evidence)
    if repeat is not None:
        latest, progress = repeat
        return (
            f"same cause ({evidence.cause}) recovered at step {latest.last_step}; only "
            f"{progress} healthy step(s) since, fewer than {evidence.min_progress_steps}: "
            "no progress"
        )
    if evidence.recoveries_last_hour >= evidence.budget:
        return (
            f"budget spent: {evidence.recoveries_last_hour} automatic recoveries in the last "
            f"hour (at most {evidence.budget})"
        )
    if evidence.clean_checkpoint_step is None:
        return "no clean checkpoint to roll back to"
    skipped = len(
        skip_steps(evidence.first_step, evidence.last_step, evidence.clean_checkpoint_step)
    )
    if skipped > evidence.max_skip_steps:
        return f"{skipped} steps to skip, more than {evidence.max_skip_steps}: not one bad batch"
    return None


def _hold(evidence: Evidence) -> str | None:
    if evidence.policy != RECOVER_POLICY:
        return "the rule's policy is hold for a person"
    if evidence.drill and not evidence.drill_of_recovery:
        return "a drill sandbox: recovery is a person's to practise"
    if evidence.taken_over_by:
        return evidence.taken_over_by
    return None


def decide(evidence: Evidence) -> Decision:
    """The verdict and its reasons (see the module's table)."""
    reasons = [_where(evidence)]
    hold = _hold(evidence)
    if hold is not None:
        return Decision(Verdict.HOLD, (*reasons, hold))
    if evidence.hardware_signals:
        signals = "; ".join(evidence.hardware_signals[:5])
        reasons.append(f"hardware signal on the node: {signals}")
        return Decision(Verdict.ISOLATE_AND_PAGE, tuple(reasons))
    rerun = evidence.rerun
    if rerun is not None:
        reasons.append(_rerun_found(evidence, rerun))
        if rerun.attribution == TRANSIENT:
            return Decision(Verdict.ISOLATE_AND_PAGE, tuple(reasons))
    stop = _stop(evidence)
    if stop is not None:
        return Decision(Verdict.STOP_AND_PAGE, (*reasons, stop))
    if any(e.cause == evidence.cause for e in evidence.earlier):
        reasons.append("same cause recovered before, and the run made progress since")
    else:
        reasons.append("first time for this cause in this job")
    reasons.append("no hardware signal on the node")
    if evidence.drill and evidence.drill_of_recovery:
        reasons.append("a drill of the recovery path: it acts on its own sandbox job only")
    reasons.append(
        f"recovery {evidence.recoveries_last_hour + 1} of at most {evidence.budget} this hour"
    )
    reasons.append(f"roll back to the clean checkpoint of step {evidence.clean_checkpoint_step}")
    if rerun is not None and rerun.attribution == DATA:
        reasons.append(_flagged_batch(rerun.step, evidence.clean_checkpoint_step))
    return Decision(Verdict.RECOVER, tuple(reasons))


def suspect(evidence: Evidence) -> tuple[int | None, str]:
    """The rank and node the verdict is about: those of a re-run that did not repeat (the
    hardware that computed the fault), else the alert's."""
    rerun = evidence.rerun
    if rerun is not None and rerun.attribution == TRANSIENT:
        rank = rerun.rank if rerun.rank is not None else evidence.rank
        return rank, rerun.node or evidence.node
    return evidence.rank, evidence.node


def _rerun_found(evidence: Evidence, rerun: Rerun) -> str:
    """What re-running the refused step says, as a reason."""
    if rerun.attribution == TRANSIENT:
        return (
            f"step {rerun.step} re-run on the same batch from the same state was finite: a "
            f"transient fault of the node {suspect(evidence)[1] or '?'}, not the data"
        )
    return (
        f"step {rerun.step} re-run on the same batch from the same state gave the non-finite "
        "value again: the data (or the model), not the node; batch flagged"
    )


def _flagged_batch(step: int, checkpoint_step: int | None) -> str:
    if checkpoint_step is not None and step > checkpoint_step:
        return f"the batch of step {step} is skipped"
    return f"the batch of step {step} is behind the checkpoint's data position: not trained again"


def skip_steps(first_step: int, last_step: int, checkpoint_step: int) -> list[int]:
    """The offending window's steps after the checkpoint: the batches the resumed run drops.
    Steps at or before the checkpoint's are already behind the restored state."""
    return [s for s in range(max(first_step, checkpoint_step + 1), last_step + 1)]
