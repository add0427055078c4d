"""Per-rank acknowledgement: a multi-rank job's command is done when every rank says so.

Every rank of a job applies a command and acknowledges it on its own (``CommandAck``, one row
per rank). The command succeeds — and the job's status follows (paused, resumed…) — only when
all ``world_size`` ranks acknowledged it as succeeded *at the same step*; until then it stays
open, so it goes on being delivered to the ranks that have not (websocket catch-up, heartbeat
and metrics replies alike). A rank's failure fails the command at once, naming the rank.

A split job — some ranks have applied it and others not — is an L3 alert naming the ranks:
at once when ranks acknowledged it at different steps, and by the watchdog when the others
are still silent ``COMMAND_SPLIT_SECONDS`` after the first rank's acknowledgement. The alert
calls a person (action "none"): a half-paused job is not paused again by a machine.

``tally`` is the pure verdict (table-driven tests). ``tally_counts`` is its status from the
answers counted by status and step, held to the same table: while a command waits for ranks, a
new acknowledgement (or a node's eight) costs one INSERT and one counted read of a row or two,
whatever the number of ranks that answered before; every rank's answer is read once, when the
verdict is final, for the merged result, the error and the split alert's ranks. The rest runs
inside ``acknowledge_command_ranks``'s transaction, with the job's row locked, so two nodes'
acknowledgements arriving together are counted one after the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from breakers.control.hearing import heard_since, heard_until
from breakers.models import OPEN_COMMAND_STATUSES, Command, CommandAck, CommandKind, CommandStatus
from core.errors import InvalidInput
from core.text import fit
from incidents.alerts.lifecycle import (
    AlertSignal,
    active_alert,
    raise_or_update_alert,
    resolve_alert,
)
from incidents.models import Job, JobRank, Layer
from incidents.notifications.rounds import notify_alert

RULE_KEY = "split-job"
RULE_NAME = "Split job: ranks disagree on a command"
# Kinds one rank may carry out for the whole job (a handler on the node, or the executor).
ANY_RANK_KINDS = frozenset({CommandKind.ISOLATE_NODE})
MAX_NAMED_RANKS = 16


@dataclass(frozen=True)
class RankAnswer:
    status: str  # succeeded | failed
    step: int | None


@dataclass(frozen=True)
class Verdict:
    """Where a command stands given its ranks' answers."""

    status: str  # "waiting", "succeeded" or "failed"
    # The first MAX_NAMED_RANKS ranks that have not answered (a world of 2³¹ ranks is a legal
    # report: it is never listed whole), and how many have not.
    missing: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()
    # Succeeded ranks by the step they applied it at, when there is more than one step.
    split_steps: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    missing_count: int = 0

    @property
    def split(self) -> bool:
        return bool(self.split_steps)


def _first_missing(world_size: int, answers: Mapping[int, object]) -> tuple[int, ...]:
    """The lowest ranks below ``world_size`` without an answer, at most MAX_NAMED_RANKS: a
    walk of len(answers) + MAX_NAMED_RANKS ranks at most, whatever the world size."""
    missing: list[int] = []
    rank = 0
    while rank < world_size and len(missing) < MAX_NAMED_RANKS:
        if rank not in answers:
            missing.append(rank)
        rank += 1
    return tuple(missing)


def tally(world_size: int, answers: Mapping[int, RankAnswer]) -> Verdict:
    """All ranks succeeded at one step → succeeded; any failure, or two steps → failed (the
    ranks disagree: not one consistent state); else waiting for the missing ranks."""
    missing = _first_missing(world_size, answers)
    missing_count = world_size - sum(1 for r in answers if 0 <= r < world_size)
    failed = tuple(sorted(r for r, a in answers.items() if a.status != CommandStatus.SUCCEEDED))
    by_step: dict[int, list[int]] = {}
    for rank, answer in sorted(answers.items()):
        if answer.status == CommandStatus.SUCCEEDED:
            by_step.setdefault(answer.step if answer.step is not None else -1, []).append(rank)
    split = {step: tuple(ranks) for step, ranks in by_step.items()} if len(by_step) > 1 else {}
    if failed or split:
        return Verdict(CommandStatus.FAILED, missing, failed, split, missing_count)
    status = "waiting" if missing else CommandStatus.SUCCEEDED
    return Verdict(status, missing, missing_count=missing_count)


def counts_ranks(command: Command, job: Job, rank: int | None) -> bool:
    """Whether this acknowledgement is one rank's among several (else it is the job's)."""
    return rank is not None and (job.world_size or 1) > 1 and command.kind not in ANY_RANK_KINDS


def _step_of(result: Mapping[str, Any]) -> int | None:
    step = result.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


@dataclass(frozen=True)
class AnswerCount:
    """How many ranks answered ``status`` at ``step``; ``in_world`` of them below the world
    size (a world that shrank leaves answers of ranks it no longer has)."""

    status: str
    step: int | None
    answers: int
    in_world: int


def tally_counts(world_size: int, counts: Iterable[AnswerCount]) -> str:
    """``tally``'s status from the answers counted by status and step alone (its table holds
    both to the same answers): a waiting command's new acknowledgement costs a few counted
    rows, not a read of every rank's answer."""
    steps: set[int] = set()
    answered = 0
    for count in counts:
        if count.answers and count.status != CommandStatus.SUCCEEDED:
            return CommandStatus.FAILED
        if count.answers:
            steps.add(count.step if count.step is not None else -1)
        answered += count.in_world
    if len(steps) > 1:
        return CommandStatus.FAILED
    return "waiting" if answered < world_size else CommandStatus.SUCCEEDED


@dataclass(frozen=True)
class RankAck:
    """One rank's answer to a command, as its acknowledgement said it."""

    rank: int
    status: str
    result: dict
    error: str = ""


def refuse_rank(job: Job, rank: int) -> InvalidInput | None:
    """A rank the job's heartbeats never counted would make the command wait for ranks that
    do not exist: refused before anything of it is written."""
    if rank < (job.world_size or 1):
        return None
    return InvalidInput(
        "The acknowledgement was refused.",
        fields={"result.rank": f"must be below the job's world size ({job.world_size})"},
    )


def record_rank_acks(
    command: Command, job: Job, answers: Sequence[RankAck]
) -> tuple[Verdict | None, dict, str]:
    """Store the ranks' answers in one statement (each rank's first: a retried ack changes
    nothing) and count them all: None while the command waits for other ranks, else the
    verdict with the result and error the command gets (every answer read once, then)."""
    now = timezone.now()
    firsts = {answer.rank: answer for answer in reversed(answers)}  # a rank's first answer
    CommandAck.objects.bulk_create(
        [_ack_row(command, answer, now) for answer in sorted(firsts.values(), key=_by_rank)],
        ignore_conflicts=True,
    )
    if command.first_ack_at is None:
        Command.objects.filter(pk=command.pk, first_ack_at__isnull=True).update(first_ack_at=now)
        command.first_ack_at = now
    world_size = job.world_size or 1
    if tally_counts(world_size, answers_counted(command, world_size)) == "waiting":
        return None, {}, ""
    acks = list(CommandAck.objects.filter(command=command).order_by("rank"))
    verdict = tally(world_size, {a.rank: RankAnswer(a.status, a.step) for a in acks})
    first = next((a for a in acks if a.rank == 0), acks[0])
    merged = {**first.result, "ranks": {str(a.rank): _summary(a) for a in acks}}
    if verdict.split:
        raise_split_alert(command, job, verdict, now)
    return verdict, merged, _error(verdict, acks)


def _by_rank(answer: RankAck) -> int:
    return answer.rank


def _ack_row(command: Command, answer: RankAck, now: datetime) -> CommandAck:
    return CommandAck(
        command=command,
        rank=answer.rank,
        status=answer.status,
        step=_step_of(answer.result),
        result=answer.result,
        error=answer.error,
        acknowledged_at=now,
    )


def answers_counted(command: Command, world_size: int) -> list[AnswerCount]:
    """The command's answers counted by status and step, in the database: one row per
    distinct answer (one while every rank agrees), whatever the number of ranks."""
    rows = (
        CommandAck.objects.filter(command=command)
        .order_by()  # the model's ordering by rank would split the groups
        .values("status", "step")
        .annotate(
            answers=Count("pk"), in_world=Count("pk", filter=Q(rank__gte=0, rank__lt=world_size))
        )
    )
    return [AnswerCount(r["status"], r["step"], r["answers"], r["in_world"]) for r in rows]


def _summary(ack: CommandAck) -> dict[str, Any]:
    summary: dict[str, Any] = {"status": ack.status, "step": ack.step}
    for key in ("path", "sha256", "apply_at_step", "rerun"):
        if key in ack.result:
            summary[key] = ack.result[key]
    return summary


def _error(verdict: Verdict, acks: list[CommandAck]) -> str:
    parts = [f"rank {a.rank}: {a.error or 'failed'}" for a in acks if a.rank in verdict.failed]
    if verdict.split:
        parts.append(f"the ranks applied it at different steps ({_steps_text(verdict)})")
    return fit("; ".join(parts[:MAX_NAMED_RANKS]), 10_000)


def _ranks_text(ranks: tuple[int, ...], count: int | None = None) -> str:
    """ "ranks 0, 1 and 30 more": ``count`` ranks in all, the first of them ``ranks``."""
    count = len(ranks) if count is None else count
    named = ", ".join(str(r) for r in ranks[:MAX_NAMED_RANKS])
    shown = min(len(ranks), MAX_NAMED_RANKS)
    more = f" and {count - shown} more" if count > shown else ""
    return f"rank{'s' if count > 1 else ''} {named}{more}"


def _steps_text(verdict: Verdict) -> str:
    return ", ".join(
        f"{_ranks_text(ranks)} at step {step}"
        for step, ranks in sorted(verdict.split_steps.items())
    )


def _split_text(command: Command, job: Job, verdict: Verdict) -> str:
    """How the ranks disagree: at which steps they applied it, or which of them never answered."""
    if verdict.split:
        return f"applied at different steps: {_steps_text(verdict)}"
    done = tuple(
        CommandAck.objects.filter(command=command)
        .order_by("rank")
        .values_list("rank", flat=True)[:MAX_NAMED_RANKS]
    )
    missing = _ranks_text(verdict.missing, verdict.missing_count)
    return (
        f"acknowledged by {_ranks_text(done, (job.world_size or 1) - verdict.missing_count)}"
        f", not by {missing} "
        f"{settings.COMMAND_SPLIT_SECONDS:.0f} s later"
    )


def raise_split_alert(command: Command, job: Job, verdict: Verdict, now: datetime) -> None:
    """L3, naming the ranks; one active alert per job, refreshed while the split lasts."""
    what = _split_text(command, job, verdict)
    named = [r for ranks in verdict.split_steps.values() for r in ranks] + list(verdict.missing)
    nodes = JobRank.objects.filter(job=job, rank__in=named[:1000]).values_list(
        "hostname", flat=True
    )
    step = int(job.current_step or 0)
    signal = AlertSignal(
        rule_key=RULE_KEY,
        rule_name=RULE_NAME,
        layer=Layer.HEALTH,
        severity="L3",
        metric="commands",
        node="",
        value=float(verdict.missing_count or len(verdict.split_steps)),
        threshold=settings.COMMAND_SPLIT_SECONDS,
        description=fit(
            f"Split job: {command.kind} #{command.pk} (apply at step {command.apply_at_step}) "
            f"{what}. The ranks are not in one consistent state: some may hold while others "
            "wait inside a collective.",
            2000,
        ),
        step=step,
        time=now,
        first_step=int(command.apply_at_step or step),
        first_time=command.first_ack_at or now,
        action="none",  # a person decides; a machine does not pause a half-paused job
        nodes=tuple(dict.fromkeys(n for n in nodes if n))[:MAX_NAMED_RANKS],
        runbook_hint="split job ranks",
    )
    outcome = raise_or_update_alert(job.pk, signal, now=now)
    if outcome.action_due:
        notify_alert(outcome.alert.pk)  # after commit


def clear_split(job_id: int, step: int | None) -> None:
    """Every rank acknowledged the same step: the job is one again."""
    alert = active_alert(job_id, RULE_KEY, "")
    if alert is not None:
        resolve_alert(alert.pk, reason="every rank acknowledged at the same step", step=step)


def flag_split_commands(now: datetime | None = None, limit: int = 100) -> int:
    """The watchdog: open commands some ranks acknowledged COMMAND_SPLIT_SECONDS ago and
    others still not. One query on open commands with a first acknowledgement; an alert per
    job, raised once while it lasts."""
    now = now or timezone.now()
    cutoff = heard_until(now) - timedelta(seconds=settings.COMMAND_SPLIT_SECONDS)
    since = heard_since()
    if since is not None and since > cutoff:
        return 0  # acknowledgements held up by the console's own outage are still arriving
    late = (
        Command.objects.filter(status__in=OPEN_COMMAND_STATUSES, first_ack_at__lt=cutoff)
        .select_related("job")
        .order_by("pk")[:limit]
    )
    flagged = 0
    for command in late:
        job = command.job
        if active_alert(job.pk, RULE_KEY, "") is not None:
            continue
        answers = {
            a.rank: RankAnswer(a.status, a.step) for a in CommandAck.objects.filter(command=command)
        }
        verdict = tally(job.world_size or 1, answers)
        if verdict.missing:
            raise_split_alert(command, job, verdict, now)
            flagged += 1
    return flagged
