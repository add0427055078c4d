"""The straggler check of running jobs: scores from each rank's own compute time (or, from
SDKs that do not report it, its heartbeat step time), a
performance-layer finding (recorded, in the daily digest, never a page) per slow rank naming
its node, resolved once the rank is back within pace. Idempotent: a second check in the same
state changes nothing (the alert's fingerprint and the history row's flag say so)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q
from django.utils import timezone

from breakers.models import RankPaceHistory
from breakers.pace.stragglers import SLOW, RankPace, Score, next_usual, scores
from incidents.alerts.lifecycle import AlertSignal, active_alert, raise_or_update_alert
from incidents.alerts.lifecycle import resolve_alert as resolve
from incidents.models import AgentStatus, Job, JobRank, JobStatus, Layer, Severity

RULE_KEY = "rank-straggler"


def _signal(score: Score, step: int, now: datetime) -> AlertSignal:
    ratios = [r for r in (score.vs_fastest, score.vs_usual) if r is not None]
    return AlertSignal(
        rule_key=RULE_KEY,
        rule_name="Straggler rank",
        layer=Layer.PERFORMANCE,
        severity=Severity.L1,
        metric=f"{score.basis}_time",
        node=_node(score),
        value=max(ratios),
        threshold=SLOW,
        description=score.describe(),
        step=step,
        time=now,
        first_step=step,
        first_time=now,
        nodes=(score.host,) if score.host else (),
        runbook_hint="straggler slow rank",
    )


def _node(score: Score) -> str:
    # The fingerprint's node: the rank's host (what an operator drains), else the rank.
    return score.host or f"rank-{score.rank}"


def _timed(seats: list[JobRank]) -> tuple[list[JobRank], str]:
    """The ranks to score and on what: their own compute time when the job's ranks report it
    (under synchronous data parallelism the step interval is every rank's alike, the slowest
    one's, and it carries a resume's pauses and warm-up); else, from SDKs that do not, the
    step time measured between heartbeats."""
    computed = [seat for seat in seats if seat.compute_seconds is not None]
    if computed:
        return computed, "compute"
    return [seat for seat in seats if seat.step_time_seconds is not None], "step"


def check_job(job_id: int, now: datetime | None = None) -> list[Score]:
    """Score the job's running ranks, raise or resolve their findings; the scores.

    Each finding in a transaction of its own: raising one locks the job's row (which its
    ingest writes too) for that finding only, however many ranks of a large job straggle.
    The ranks' learnt paces and flags are written last, in one statement: a check that dies
    before then leaves the old flags, and the next check raises or resolves the same findings
    again (by their fingerprints) — never a finding left open with its flag cleared."""
    now = now or timezone.now()
    seats, basis = _timed(list(JobRank.objects.filter(job_id=job_id, status=AgentStatus.RUNNING)))
    history = {h.rank: h for h in RankPaceHistory.objects.filter(job_id=job_id)}
    paces = {
        seat.rank: RankPace(
            seat.rank,
            seat.hostname,
            float((seat.compute_seconds if basis == "compute" else seat.step_time_seconds) or 0.0),
            history[seat.rank].usual_step_time if seat.rank in history else None,
            history[seat.rank].samples if seat.rank in history else 0,
            history[seat.rank].flagged if seat.rank in history else False,
            basis,
        )
        for seat in seats
    }
    steps = {seat.rank: seat.step for seat in seats}
    found = scores(list(paces.values()))
    for score in found:
        if score.straggler:
            raise_or_update_alert(job_id, _signal(score, steps[score.rank], now), now=now)
        elif paces[score.rank].flagged:
            _resolve(job_id, score)
    _remember(job_id, paces, found)
    return found


def _remember(job_id: int, paces: dict[int, RankPace], found: list[Score]) -> None:
    """Every scored rank's usual pace and flag, in one upsert on the job and rank (one
    statement for a job of 10,000 ranks, not three a rank)."""
    rows = []
    for score in found:
        usual, samples = next_usual(paces[score.rank], score.straggler)
        rows.append(
            RankPaceHistory(
                job_id=job_id,
                rank=score.rank,
                usual_step_time=usual,
                samples=samples,
                flagged=score.straggler,
            )
        )
    RankPaceHistory.objects.bulk_create(
        rows,
        update_conflicts=True,
        unique_fields=["job", "rank"],
        update_fields=["usual_step_time", "samples", "flagged"],
    )


def _resolve(job_id: int, score: Score) -> None:
    alert = active_alert(job_id, RULE_KEY, _node(score))
    if alert is not None:
        resolve(alert.pk, reason=f"rank {score.rank} is back within pace")


def check_running_jobs(now: datetime | None = None) -> dict[int, list[Score]]:
    """Every running job with ranks that measured a step or compute time → its scores."""
    timed = Q(ranks__step_time_seconds__isnull=False) | Q(ranks__compute_seconds__isnull=False)
    jobs = (
        Job.objects.filter(timed, status=JobStatus.RUNNING).values_list("pk", flat=True).distinct()
    )
    return {job_id: check_job(job_id, now) for job_id in jobs}
