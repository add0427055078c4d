"""Evaluating a job's metric points against its rules: serialised per job, exactly once.

``evaluate_job(job_id)`` runs in transactions that each
1. lock the job's ``EvaluationState`` row (``SELECT … FOR UPDATE``, blocking: a second worker
   for the same job waits, then continues from the cursor the first one advanced);
2. read about ``batch.chunk_points`` points with ``id > cursor`` in id order (``read_points``: raw
   rows and ingest's blocks, a block whole — ``breakers.storage.points``);
3. feed them to the pure engine, restored from the stored state;
4. apply the findings (alerts, incident, timeline rows — ``incidents.alerts.lifecycle``);
5. save the new cursor and engine state.
Alerts, cursor and state commit together or not at all, so a worker killed mid-task (the task
is redelivered: ``acks_late``) or a task delivered twice neither loses nor doubles an alert.
Nor does a brake due while some of a multi-rank job's ranks hold and the others' holds are on
their way (``AwaitHolds``, ``breakers.control.apply_at``): its chunk rolls back whole, and the
task evaluates it again a moment later, the brake then named where every rank holds.

Order of points: a job's batches are written concurrently, so its ids are not in commit
order; a chunk ends at the job's horizon (``breakers.storage.writers``), below which no batch
can commit any more, so the id cursor never skips a point committed later with a lower id.
Across chunks, points are evaluated in that (arrival) order; within a chunk they are
sorted by (step, id), so a batch whose points are not in step order (several metrics, several
nodes) is still evaluated in step order. A point that arrives late with a step lower than
points already evaluated is evaluated once, when it arrives — it is never re-evaluated.

Different jobs lock different rows, so they evaluate in parallel on several workers.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from breakers.control.braking import brake_for_alert, seconds_to_gather_holds
from breakers.control.hang import rank_numbers
from breakers.detection import shadow
from breakers.detection.batch import PointBatch, chunk_points, feed_batch
from breakers.detection.engine import Finding, JobEvaluator, RuleSpec
from breakers.detection.rulepack import ruleset_fingerprint
from breakers.detection.rules import rules_for_job
from breakers.models import EvaluationState, MetricPoint
from breakers.storage.points import next_chunk
from incidents.alerts.lifecycle import (
    AlertOutcome,
    AlertSignal,
    active_alert,
    append_timeline,
    raise_or_update_alert,
    resolve_alert,
    settle_incident,
)
from incidents.models import Alert, Job, Layer, TimelineEntry, TimelineKind
from incidents.notifications.rounds import notify_alert

log = logging.getLogger(__name__)


# Ranks an alert's description names before it counts the rest.
FIRING_NAMED = 3

# One engine series of an alert's fingerprint: (metric name or "*" when pooled, rank or None).
Series = tuple[str, int | None]


@dataclass
class EvaluationReport:
    job_id: int
    points: int = 0
    cursor: int = 0
    raised: int = 0
    escalated: int = 0
    resolved: int = 0
    shadow: int = 0  # would-have-fired findings of shadow rules, recorded and not acted on
    holds_wait: float = 0.0  # seconds until it is to run again (a brake awaits ranks' holds)


def on_alert_raised(outcome: AlertOutcome) -> None:
    """Automatic braking: the control plane issues the rule's action, at once, as the system.

    Called once per new alert and once per escalation of an existing one (``outcome.created``
    / ``outcome.escalated``), inside the evaluation transaction that raised it: the command
    commits with the alert and the cursor, exactly once (its idempotency key names the alert
    and level), and is pushed to the agent after commit. "none" and "record" ask for nothing.
    """
    brake_for_alert(outcome.alert)
    notify_alert(
        outcome.alert.pk
    )  # pages the on-call after commit (incidents.notifications.rounds)


BREAKERS_FAILING_RULE = "breakers-failing"
MAX_ERROR_TEXT = 500


def report_failing_breakers(job_id: int, error: BaseException) -> None:
    """Fail safe: a job whose evaluation raised is itself an L3 health alert (and incident),
    "the breakers of job X are failing: <error>", paged to the on-call. Raised once; a later
    failure only updates it. Never raises: the caller is already handling an error."""
    try:
        with transaction.atomic():
            job = Job.objects.filter(pk=job_id).only("name", "current_step").first()
            if job is None:
                return
            text = f"{type(error).__name__}: {error}"[:MAX_ERROR_TEXT]
            now = datetime.now(tz=UTC)
            step = job.current_step or 0
            outcome = raise_or_update_alert(
                job_id,
                AlertSignal(
                    rule_key=BREAKERS_FAILING_RULE,
                    rule_name="Breakers failing",
                    layer=Layer.HEALTH,
                    severity="L3",
                    metric="evaluation",
                    node="",
                    value=1.0,
                    threshold=None,
                    description=f"the breakers of job {job.name} are failing: {text}",
                    step=step,
                    time=now,
                    first_step=step,
                    first_time=now,
                    action="none",
                    runbook_hint="breakers failing evaluation error",
                ),
            )
            if outcome.created or outcome.escalated:
                notify_alert(outcome.alert.pk)
    except Exception:
        log.exception("could not raise the breakers-failing alert of job %s", job_id)


def clear_failing_breakers(job_id: int) -> None:
    """The job's evaluation succeeded again: resolve its breakers-failing alert, if any."""
    alert = active_alert(job_id, BREAKERS_FAILING_RULE, "")
    if alert is not None:
        resolve_alert(alert.pk, reason="the job's evaluation succeeded again")


def evaluate_job(
    job_id: int,
    *,
    tick_at: float | None = None,
    chunk_size: int | None = None,
    await_holds: bool = False,
) -> EvaluationReport:
    """Evaluate every point of the job not evaluated yet; with ``tick_at`` (epoch seconds),
    then also judge the time-based detectors at that moment (silence, node-failure windows).
    ``chunk_size``: points per transaction, by default ``batch.chunk_points`` of the state.
    ``await_holds``: a brake that should wait for the job's other ranks to hold
    (``breakers.control.apply_at``) stops the evaluation before its chunk, nothing of that
    chunk written, and ``report.holds_wait`` says when the caller is to evaluate again."""
    report = EvaluationReport(job_id)
    if not EvaluationState.objects.filter(job_id=job_id).exists():
        if not Job.objects.filter(pk=job_id).exists():
            return report  # the job is gone (a task enqueued before it was deleted)
        EvaluationState.objects.get_or_create(job_id=job_id)
    while True:
        before = replace(report)
        try:
            rows, last_chunk = _evaluate_chunk(job_id, tick_at, chunk_size, report, await_holds)
        except AwaitHolds as awaiting:
            # Rolled back: the chunk is evaluated again, whole, when the holds are in.
            EvaluationState.objects.filter(job_id=job_id, holds_awaited_since=None).update(
                holds_awaited_since=awaiting.since
            )
            return replace(before, holds_wait=awaiting.seconds)
        if rows:
            # A braked episode ends on healthy points after its resume (episode.py).
            settle_incident(job_id, max(row[2] for row in rows))
        if last_chunk:
            return report


def _evaluate_chunk(
    job_id: int,
    tick_at: float | None,
    chunk_size: int | None,
    report: EvaluationReport,
    await_holds: bool,
) -> tuple[list[tuple], bool]:
    """One transaction of ``evaluate_job``: its points, and whether it was the last chunk."""
    with transaction.atomic():
        state = EvaluationState.objects.select_for_update().get(job_id=job_id)
        size = chunk_size or chunk_points(len((state.state or {}).get("series", ())))
        rows, more = read_points(job_id, state.cursor, size)
        if not rows and tick_at is None:
            report.cursor = state.cursor
            return rows, True
        run = _Run(job_id, state, rules_for_job(job_id), report, await_holds=await_holds)
        run.feed(rows)
        if not more and tick_at is not None:
            run.tick(tick_at)
        run.save(rows)
    return rows, not more


class AwaitHolds(Exception):  # noqa: N818 (not an error: the evaluation waits)
    """A brake is due while some of the job's ranks hold and the others' holds are on their
    way: the chunk's transaction rolls back and is evaluated again ``seconds`` later."""

    def __init__(self, seconds: float, since: datetime) -> None:
        super().__init__(f"awaiting the other ranks' holds for {seconds:.2f} s")
        self.seconds, self.since = seconds, since


# The evaluator reads back what ingest wrote, by id cursor: that is what makes it exactly-once
# without any hand-over protocol (a point is evaluated iff its id is at most the committed
# cursor). The read is kept cheap instead: plain SQL with the time as epoch seconds, so no
# datetime is built per point (half of the evaluator's CPU went to Django's timestamp loader),
# and on PostgreSQL a batch is one block row, unnested by the server.
READ_POINTS_SQL = (
    "SELECT id, name, step, EXTRACT(EPOCH FROM time)::float8, value, node, rank "
    "FROM brakeline_points_after(%s, %s, %s) ORDER BY id"
)


def read_points(job_id: int, after_id: int, limit: int) -> tuple[list[tuple], bool]:
    """The job's next chunk of points above ``after_id`` (about ``limit``, whole blocks), in id
    order, as tuples (id, name, step, time in epoch seconds, value, node, rank); and whether
    more follow it."""
    chunk = next_chunk(job_id, after_id, limit)
    if chunk.high is None:
        return [], False
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(READ_POINTS_SQL, [job_id, after_id, chunk.high])
            return cursor.fetchall(), chunk.more
    rows = (
        MetricPoint.objects.filter(job_id=job_id, id__gt=after_id, id__lte=chunk.high)
        .order_by("id")
        .values_list("id", "name", "step", "time", "value", "node", "rank")
    )
    points = [
        (id_, name, step, time.timestamp(), value, node, rank)
        for id_, name, step, time, value, node, rank in rows
    ]
    return points, chunk.more


def _restore(rules: list[RuleSpec], stored: dict[str, Any], job_id: int) -> JobEvaluator:
    if not stored:
        return JobEvaluator(rules)
    try:
        return JobEvaluator.from_state(rules, stored)
    except (ValueError, KeyError, TypeError) as error:
        # A state this code cannot read (an older format): start afresh rather than never
        # evaluating the job again. Open alerts stay open until their condition fires again.
        log.error("evaluation state of job %s unreadable, restarting it: %s", job_id, error)
        return JobEvaluator(rules)


def _to_datetime(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, tz=UTC)


class _Run:
    """One transaction's evaluation of one job: the restored engine, and its findings applied.

    An alert's fingerprint is (job, rule, node) but the engine keeps a series per metric and
    per rank too (``loss|grad_norm`` on 2 ranks is four series of one rule): ``open`` tracks
    which (metric, rank) series of each fingerprint are firing, so the alert resolves only when
    the last of them clears, and its description counts the ranks firing.

    A thousand ranks firing one rule in one chunk are a thousand findings of one alert: the
    first raises (or updates) it as it comes, since it may brake; the others only join its
    firing series, and the latest of them is written once (``_pending``), before anything else
    touches that alert (its clear, the tick) and at the end of the run. The alert ends as the
    findings written one by one would leave it, for one write (and one lock of the job's row)
    instead of a thousand.
    """

    def __init__(
        self,
        job_id: int,
        state: EvaluationState,
        rules: list[RuleSpec],
        report: EvaluationReport,
        *,
        await_holds: bool = False,
    ) -> None:
        self.job_id, self.state, self.report = job_id, state, report
        self.await_holds = await_holds
        self.rules = {rule.key: rule for rule in rules}
        self.fingerprint = ruleset_fingerprint(rules)
        self.evaluator = _restore(rules, state.state, job_id)
        self._resume: tuple[int, float, int] | None = None
        self._resume_read = False  # read once per run, and only when a rule fires (rare)
        self._noted: set[tuple[str, str]] = set()
        self.open: dict[tuple[str, str], set[Series]] = defaultdict(set)
        # Fingerprints this run raised or updated, their alert still open; and of those, the
        # latest finding not written yet.
        self._written: set[tuple[str, str]] = set()
        self._pending: dict[tuple[str, str], Finding] = {}
        for episode in self.evaluator.open_episodes():
            fingerprint = (episode["rule"], episode["node"] or "")
            if fingerprint not in self.open and not self._still_open(fingerprint):
                # Its alert was closed from outside (re-armed when training resumed after
                # its brake): a recurrence must fire, and brake, again.
                self.evaluator.rearm(*fingerprint)
                continue
            self.open[fingerprint].add((episode["metric"], episode["rank"]))
        for orphan in self.evaluator.orphaned:
            # Its rule was removed or disabled, or now keys its series differently.
            self._series_cleared(
                orphan["rule"],
                orphan["node"] or "",
                (orphan["metric"], orphan["rank"]),
                reason="its rule was removed or disabled",
                step=None,
            )

    def _still_open(self, fingerprint: tuple[str, str]) -> bool:
        """Whether what an open episode raised is still open: its alert, or for a shadow rule
        its would-have-fired record. A live rule's episode with no alert may be one a shadow
        rule opened before it was promoted: that record is closed, and the rule fires for real
        at its next anomalous point."""
        if self.rules[fingerprint[0]].shadow:
            return shadow.has_open_firing(self.job_id, *fingerprint)
        if active_alert(self.job_id, *fingerprint) is not None:
            return True
        shadow.close_firing(
            self.job_id, *fingerprint, reason="the rule went live", step=None, at=None
        )
        return False

    def feed(self, rows: list[tuple]) -> None:
        rows.sort(key=lambda row: (row[2], row[0]))  # step order within the chunk (see above)
        # The chunk judged as arrays (breakers.detection.batch): the findings, in their order,
        # are those of the points fed one by one, each applied before the next point's.
        batch = PointBatch.from_rows(row[1:] for row in rows)
        feed_batch(self.evaluator, batch, self._apply)
        self.report.points += len(rows)

    def tick(self, now: float) -> None:
        self._flush()
        for finding in self.evaluator.tick(now):
            self._apply(finding)
        self.state.last_tick = now

    def save(self, rows: list[tuple]) -> None:
        self._flush()
        state = self.state
        if rows:
            state.cursor = max(row[0] for row in rows)
            state.points_evaluated += len(rows)
        state.state = self.evaluator.to_state()
        state.rules_fingerprint = self.fingerprint
        state.holds_awaited_since = None  # whatever a brake awaited was issued, or is gone
        state.save()
        self.report.cursor = state.cursor

    def _apply(self, finding: Finding) -> None:
        rule = self.rules[finding.rule_key]
        node = (finding.node or "") if rule.per_node else ""
        series = (finding.metric if rule.per_metric else "*", finding.rank)
        if finding.kind == "clear":
            self._series_cleared(
                rule.key, node, series, finding.description, finding.step, finding.time
            )
            return
        if rule.shadow:  # observe only: what it would have done, and nothing more
            self.open[(rule.key, node)].add(series)
            shadow.record_firing(self.job_id, finding, node)
            self.report.shadow += 1
            return
        fingerprint = (rule.key, node)
        if fingerprint in self._written:
            # Its alert is open and was written in this run: nothing is due but its update.
            self.open[fingerprint].add(series)
            self._pending[fingerprint] = finding
            return
        if self._logged_before_resume(finding, rule.key, node):
            return
        self.open[fingerprint].add(series)
        self._raise(fingerprint, finding)

    def _flush(self, fingerprint: tuple[str, str] | None = None) -> None:
        """Write the pending update of one fingerprint, or of every one."""
        due = [fingerprint] if fingerprint is not None else list(self._pending)
        for key in due:
            finding = self._pending.pop(key, None)
            if finding is not None:
                self._raise(key, finding)

    def _raise(self, fingerprint: tuple[str, str], finding: Finding) -> None:
        """The finding's alert raised or updated, naming the fingerprint's firing ranks; a new
        alert, or an escalated one, brakes."""
        node = fingerprint[1]
        signal = _signal(finding, node, _ranks_firing(self.open[fingerprint]))
        outcome = raise_or_update_alert(self.job_id, signal)
        self._written.add(fingerprint)
        self.report.raised += outcome.created
        self.report.escalated += outcome.escalated
        if outcome.action_due and outcome.alert.incident_id is not None:
            self._await_holds(outcome.alert)
            on_alert_raised(outcome)

    def _await_holds(self, alert: Alert) -> None:
        """Raise ``AwaitHolds`` when the alert's brake is to wait for the job's other ranks'
        holds (nothing read unless a brake is due, and only for a job of several ranks)."""
        if not self.await_holds:
            return
        now = timezone.now()
        since = self.state.holds_awaited_since
        wait = seconds_to_gather_holds(alert, since, now)
        if wait > 0:
            raise AwaitHolds(wait, since or now)

    def _logged_before_resume(self, finding: Finding, rule_key: str, node: str) -> bool:
        """A point the job logged before its last resume, at or before the step it resumed
        from, but evaluated only after the resume (late over the network, or a backed-up
        worker): the resume re-armed the brake's rules, so without this check that old point
        would raise a new alert and brake the resumed run again for an anomaly already
        braked. It is recorded on the incident and its series re-armed (the next anomalous
        point fires). Both conditions are needed: a restarted process logs low steps again
        *after* the resume, and a resumed run logs later steps; those brake as usual."""
        if active_alert(self.job_id, rule_key, node) is not None:
            return False  # an open alert takes the point as an update, never a new brake
        if not self._resume_read:
            self._resume, self._resume_read = _last_resume(self.job_id), True
        if self._resume is None:
            return False
        step, at, incident_id = self._resume
        if finding.step > step or finding.time > at:
            return False
        self.evaluator.rearm(rule_key, node)
        if (rule_key, node) in self._noted:
            return True  # a big job's ranks all send theirs late: one note per rule and run
        self._noted.add((rule_key, node))
        append_timeline(
            incident_id,
            TimelineKind.NOTE,
            f"{finding.metric} at step {finding.step} ({finding.description}) was logged "
            f"before training resumed from step {step} and reached the rules only after: "
            "that anomaly was already braked, so it does not brake the resumed run",
            step=finding.step,
            data={"event": "logged_before_resume", "rule": rule_key, "node": node},
        )
        log.info("job %s: %s at step %s logged before the resume", self.job_id, rule_key, step)
        return True

    def _series_cleared(
        self,
        rule_key: str,
        node: str,
        series: Series,
        reason: str,
        step: int | None,
        at: float | None = None,
    ) -> None:
        self._flush((rule_key, node))
        firing = self.open[(rule_key, node)]
        firing.discard(series)
        if firing:
            return  # another series of the same alert still fires
        self._written.discard((rule_key, node))
        rule = self.rules.get(rule_key)
        if rule is None or rule.shadow:  # a rule gone may have been a shadow rule
            shadow.close_firing(self.job_id, rule_key, node, reason=reason, step=step, at=at)
            if rule is not None:
                return
        alert = active_alert(self.job_id, rule_key, node)
        if alert is not None and resolve_alert(alert.pk, reason=reason, step=step):
            self.report.resolved += 1


def _last_resume(job_id: int) -> tuple[int, float, int] | None:
    """(step, epoch seconds, incident id) of the job's last resume with a known step."""
    row = (
        TimelineEntry.objects.filter(
            incident__job_id=job_id, kind=TimelineKind.RESUMED, step__isnull=False
        )
        .order_by("-at", "-pk")
        .values_list("step", "at", "incident_id")
        .first()
    )
    if row is None or row[0] is None:
        return None
    return (row[0], row[1].timestamp(), row[2])


def _ranks_firing(firing: set[Series]) -> str:
    """The prefix "ranks 0, 3 firing; " when several ranks' series of one alert fire, a few
    named and the rest counted ("ranks 0, 3, 7 and 997 more firing; "), else "": the
    finding's own description already names its rank."""
    ranks = {rank for _, rank in firing if rank is not None}
    if len(ranks) < 2:
        return ""
    return f"{rank_numbers(sorted(ranks), FIRING_NAMED)} firing; "


def _signal(finding: Finding, node: str, prefix: str = "") -> AlertSignal:
    return AlertSignal(
        rule_key=finding.rule_key,
        rule_name=finding.rule_name,
        layer=finding.layer,
        severity=finding.severity,
        metric=finding.metric,
        node=node,
        value=finding.value,
        threshold=finding.threshold,
        description=prefix + finding.description,
        step=finding.step,
        time=_to_datetime(finding.time),
        first_step=finding.first_step,
        first_time=_to_datetime(finding.first_time),
        duration_seconds=finding.duration_seconds,
        duration_steps=finding.duration_steps,
        action=finding.action,
        action_params=dict(finding.action_params),
        nodes=tuple(finding.nodes),
        runbook_hint=finding.runbook,
    )
