"""Metric points streamed by training processes, breaker rules, and evaluation state."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import models

from breakers.detection.engine import ACTIONS, DETECTOR_KINDS, LAYERS, SEVERITIES, RuleSpec
from breakers.detection.ruleset_core import RULE_FIELDS
from breakers.recovery.verdict import DEFAULT_BUDGET, HOLD_POLICY, POLICIES
from core.fields import NonFiniteFloatField, PostgresArrayField
from incidents.models import Job, Team


class MetricPoint(models.Model):
    """One value of one metric at one training step.

    Written in bulk by ``breakers.agent.store`` (one ``COPY`` per batch on PostgreSQL), never one
    ORM save per point. ``id`` grows in commit order within a job because ingest of one job is
    serialised by a row lock on the job, so the evaluator can use it as its cursor.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=200)
    step = models.BigIntegerField()
    time = models.DateTimeField()
    value = NonFiniteFloatField()
    node = models.CharField(max_length=200, null=True, blank=True)
    # The process (torch.distributed rank) that measured it; 0 for a single-process job.
    # Not in the indexes: a series' step range holds every rank, read in one scan.
    rank = models.IntegerField(default=0)

    class Meta:
        indexes = [
            # "the last W points of metric M of job J" and step ranges of one series
            models.Index(fields=["job", "name", "step"], name="metric_series_step"),
            # time ranges of one series (charts by time, silence checks)
            models.Index(fields=["job", "name", "time"], name="metric_series_time"),
            # the evaluator's cursor walk: "points of job J with id > C, in id order"
            models.Index(fields=["job", "id"], name="metric_job_cursor"),
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.step}={self.value}"


class MetricBatch(models.Model):
    """The record that a metrics batch with this id was stored (protocol 2's idempotency).

    Inserted by ``breakers.agent.store`` in the transaction that writes the batch's points, so
    the record exists exactly when the points do: a console that dies between the commit and
    its reply finds the record when the agent retries, and answers as it did the first time
    instead of storing the points again. Unique per job: ids are the agent's, not global.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    batch_id = models.CharField(max_length=128)
    accepted = models.PositiveIntegerField()
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "batch_id"], name="metric_batch_once"),
        ]

    def __str__(self) -> str:
        return f"batch {self.batch_id} of job {self.job_id} ({self.accepted} points)"


class MetricBlock(models.Model):
    """Up to ``BLOCK_COLUMNS`` steps of one rank (and node) of a job as arrays. On PostgreSQL
    ingest writes each batch as one block per rank and node (``breakers.agent.store``), and
    compaction later merges a rank's narrow blocks (and any raw rows left from before) into wide
    ones once the evaluator and the rollups are past them (``breakers.storage.compaction``).
    The embedded SQLite mode keeps one ``MetricPoint`` row per point instead.

    A *column* is one logging of a step: ``steps[c]`` and ``times[c]``; ``vals[m][c]`` is metric
    ``names[m]`` at that column, NULL where it was not logged (NULL is absence, NaN and ±Inf are
    values). ``tdelta[m][c]``: microseconds the point's time lies after ``times[c]`` (NULL when
    every point of the block has its column's time). A step logged twice (a rank restarted from a
    checkpoint re-logs its steps) has two columns, so nothing is merged away. ~8 bytes a point
    for dense series instead of ~200 as a row. ``last_id`` comes from ``MetricPoint``'s id
    sequence: one commit-ordered id series per job over raw rows and blocks, which every
    id-cursor reader walks. Readers go through the ``brakeline_points`` (one series, a step
    range) and ``brakeline_points_after`` (every point in an id range) SQL functions.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    rank = models.IntegerField(default=0)
    node = models.CharField(max_length=200, null=True, blank=True)
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    first_time = models.DateTimeField()
    last_time = models.DateTimeField()
    # Written by ingest: the next id of MetricPoint's sequence (the column's default). Merged by
    # compaction: the greatest id folded in, at or below every cursor, so a reader of points
    # above a cursor never sees a merged block again.
    last_id = models.BigIntegerField()
    names = PostgresArrayField(element="varchar")
    steps = PostgresArrayField(element="int8", null=True)  # NULL: first_step … last_step
    times = PostgresArrayField(element="timestamptz")
    vals = PostgresArrayField(element="float8")
    tdelta = PostgresArrayField(element="int4", null=True)

    class Meta:
        indexes = [
            # a series' step range (charts, reviews), the newest blocks of a job (sparklines)
            models.Index(fields=["job", "first_step"], name="metric_block_step"),
            # "the job's step at a moment" (chart markers) and retention's time cut-off
            models.Index(fields=["job", "first_time"], name="metric_block_time"),
            # the id-cursor walks (evaluator, rollups, compaction) over blocks written by ingest
            models.Index(fields=["job", "last_id"], name="metric_block_cursor"),
        ]

    def __str__(self) -> str:
        return (
            f"block of job {self.job_id} rank {self.rank} steps {self.first_step}–{self.last_step}"
        )


class CompactionCursor(models.Model):
    """The last MetricPoint id of a job compacted into ``MetricBlock`` rows, and the metric
    names compacted so far (the job's series list once its raw rows are gone).

    Never past the evaluator's or the rollups' cursor: what they still have to read stays raw.
    Advanced by compare-and-swap in the transaction that writes the blocks and deletes the raw
    rows, so two compactions of one job never fold the same points twice.
    """

    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="compaction_cursor"
    )
    cursor = models.BigIntegerField(default=0)
    names = models.JSONField(default=list, blank=True)
    points = models.BigIntegerField(default=0, help_text="Points compacted so far.")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"compaction of job {self.job_id} up to point {self.cursor}"


# --- Rules as data, and the evaluator's per-job state ---------------------------------------


def _choices(values) -> list[tuple[str, str]]:
    return [(value, value) for value in values]


class Rule(models.Model):
    """A breaker rule (docs/design.md "Detectors and rules"), as a row the admin edits.

    ``team`` NULL: a rule of the default pack (installed by migration 0004 from
    ``breakers.detection.rulepack``). A team row with the same ``key`` replaces the default rule
    for that
    team's jobs (to disable it, or to change any field); a team row with a new key adds a rule.
    The columns are ``breakers.detection.engine.RuleSpec``'s fields; ``clean()`` validates a row by
    building its RuleSpec, so the admin refuses what the engine would refuse.
    """

    team = models.ForeignKey(
        Team,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="rules",
        help_text="Empty: the default pack (every team). Set: this team's override or addition.",
    )
    key = models.SlugField(max_length=100)
    name = models.CharField(max_length=200)
    layer = models.CharField(max_length=16, choices=_choices(LAYERS))
    metric = models.CharField(
        max_length=300,
        help_text="Exact name or glob (gpu.*.temp); several joined with | (loss|grad_norm).",
    )
    detector = models.CharField(max_length=32, choices=_choices(sorted(DETECTOR_KINDS)))
    params = models.JSONField(default=dict, blank=True)
    severity = models.CharField(max_length=2, choices=_choices(SEVERITIES))
    action = models.CharField(max_length=32, choices=_choices(ACTIONS), default="none")
    action_params = models.JSONField(default=dict, blank=True)
    per_node = models.BooleanField(default=False)
    per_metric = models.BooleanField(default=True)
    enabled = models.BooleanField(default=True)
    clear_after = models.PositiveIntegerField(
        default=1, help_text="Healthy observations in a row before the alert resolves."
    )
    clear_after_seconds = models.FloatField(
        default=0.0, help_text="... spanning at least this many seconds (hysteresis)."
    )
    runbook = models.CharField(max_length=64, blank=True)
    recovery = models.CharField(
        max_length=16,
        choices=_choices(POLICIES),
        default=HOLD_POLICY,
        help_text="After this rule's automatic L3 brake: hold for a person, or recover "
        "automatically (roll back to the last clean checkpoint, skip the batch, resume).",
    )
    recovery_budget = models.PositiveSmallIntegerField(
        default=DEFAULT_BUDGET, help_text="At most this many automatic recoveries per job per hour."
    )
    shadow = models.BooleanField(
        default=False,
        help_text="Observe only: record what the rule would have done, raise and do nothing.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    SPEC_FIELDS = RULE_FIELDS  # the rule's columns, as the pure core names them

    class Meta:
        constraints = [
            # NULL teams are distinct in a unique index, so the default pack needs its own.
            models.UniqueConstraint(
                fields=["key"], condition=models.Q(team__isnull=True), name="default_rule_key"
            ),
            models.UniqueConstraint(fields=["team", "key"], name="team_rule_key"),
        ]
        ordering = ["team_id", "key"]

    def __str__(self) -> str:
        owner = self.team.name if self.team is not None else "default pack"
        return f"{self.key} ({owner})"

    def to_spec(self) -> RuleSpec:
        """The engine's rule; ValueError when the row is not a valid rule."""
        return RuleSpec.from_dict({name: getattr(self, name) for name in self.SPEC_FIELDS})

    def clean(self) -> None:
        try:
            self.to_spec()
        except (ValueError, TypeError) as error:
            raise ValidationError(str(error)) from None


class EvaluationState(models.Model):
    """The evaluator's progress on one job: the point cursor and the engine state, saved in the
    same transaction as the alerts they produced (that is what makes evaluation exactly-once).

    The row is also the job's evaluation lock: an evaluation holds it ``FOR UPDATE``, so a
    second worker for the same job waits and then continues from the advanced cursor.
    """

    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="evaluation"
    )
    cursor = models.BigIntegerField(default=0, help_text="Last MetricPoint id evaluated.")
    state = models.JSONField(default=dict, blank=True)  # JobEvaluator.to_state(), strict JSON
    rules_fingerprint = models.CharField(max_length=64, blank=True)
    points_evaluated = models.BigIntegerField(default=0)
    last_tick = models.FloatField(null=True, blank=True, help_text="Epoch seconds.")
    # Since when a brake due in the next chunk waits for the job's other ranks to hold
    # (breakers.control.apply_at, "Gathering the holds"); None once a chunk is committed.
    holds_awaited_since = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"evaluation of job {self.job_id} at point {self.cursor}"


# --- Rollups: what long-range charts read once raw points are gone (breakers.storage) -------


class MetricRollup(models.Model):
    """One time bucket (10 s or 1 min) of one series of one rank of a job, merged from raw
    points by ``breakers.storage.rollups`` in the transaction that advances the job's
    ``RollupCursor``, so each point is counted exactly once.

    Finite values give min/max with the steps where they occurred (a chart draws a spike where
    it was, never averaged away), count, sum and sum of squares (the mean and the loss band);
    NaN, +Inf and -Inf are counted per kind with the step of their first occurrence.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    name = models.CharField(max_length=200)
    rank = models.IntegerField(default=0)
    seconds = models.SmallIntegerField(help_text="Bucket width: 10 or 60.")
    bucket = models.DateTimeField(help_text="Start of the bucket.")
    first_step = models.BigIntegerField()
    last_step = models.BigIntegerField()
    last_value = NonFiniteFloatField()
    count = models.BigIntegerField(help_text="Finite values.")
    total = models.FloatField(default=0.0)
    squares = models.FloatField(default=0.0)
    min_value = models.FloatField(null=True)
    min_step = models.BigIntegerField(null=True)
    max_value = models.FloatField(null=True)
    max_step = models.BigIntegerField(null=True)
    nan_count = models.BigIntegerField(default=0)
    nan_step = models.BigIntegerField(null=True)
    pos_inf_count = models.BigIntegerField(default=0)
    pos_inf_step = models.BigIntegerField(null=True)
    neg_inf_count = models.BigIntegerField(default=0)
    neg_inf_step = models.BigIntegerField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "name", "rank", "seconds", "bucket"], name="metric_rollup_once"
            ),
        ]
        indexes = [
            # a chart's read: one series at one width across every rank (the spread), by step
            models.Index(fields=["job", "name", "seconds", "first_step"], name="rollup_series"),
            # ... and one rank's line, without reading the other ranks' rows
            models.Index(
                fields=["job", "name", "seconds", "rank", "first_step"], name="rollup_rank_series"
            ),
            # retention: the oldest buckets first
            models.Index(fields=["bucket"], name="rollup_bucket"),
        ]

    def __str__(self) -> str:
        return f"{self.name}[{self.rank}]@{self.bucket:%Y-%m-%d %H:%M:%S}/{self.seconds}s"


class RollupCursor(models.Model):
    """The last MetricPoint id of a job merged into its rollups (the high-water mark).

    Advanced in the same transaction as the merge; the row is also the job's rollup lock
    (``FOR UPDATE``), so two runs of the task never merge the same points twice. Retention
    deletes only raw points at or below it: a point is never gone before it is in the rollups.
    """

    job = models.OneToOneField(
        Job, on_delete=models.CASCADE, primary_key=True, related_name="rollup_cursor"
    )
    cursor = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"rollups of job {self.job_id} up to point {self.cursor}"


class RankPaceHistory(models.Model):
    """A rank's usual step time, learnt by ``breakers.pace.checks`` at each straggler check (a
    slow moving average of the heartbeats' step time, not fed while the rank is flagged), and
    whether it is flagged as a straggler now. One row per job and rank."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    rank = models.IntegerField()
    usual_step_time = models.FloatField(default=0.0)
    samples = models.IntegerField(default=0)
    flagged = models.BooleanField(default=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "rank"], name="rank_pace_once")]

    def __str__(self) -> str:
        return f"pace of rank {self.rank} of job {self.job_id}"
