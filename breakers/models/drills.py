"""Fire drills (docs/drills.md): a scenario run on a sandbox job, and its scorecard.

A ``DrillRun`` is one scenario of one drill set on one sandbox job. Its ``status`` moves only
along ``DRILL_TRANSITIONS`` (compare-and-swap, ``breakers.drills.runs``); once it is passed,
failed or error nothing about it changes again: its ``DrillCheck`` lines are append-only rows
written in the same transaction that finishes the run, so a report is kept as it was judged.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from core.append_only import AppendOnlyModel, AppendOnlyQuerySet
from incidents.models import Job, Team

__all__ = ["DRILL_TRANSITIONS", "DrillCheck", "DrillRun", "DrillStatus", "DrillWorkload"]


class DrillStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    PASSED = "passed", "Passed"  # every scorecard line passed
    FAILED = "failed", "Failed"  # at least one line failed
    ERROR = "error", "Error"  # the drill itself could not be carried out


DRILL_TRANSITIONS: dict[str, set[str]] = {
    DrillStatus.QUEUED: {DrillStatus.RUNNING, DrillStatus.ERROR},
    DrillStatus.RUNNING: {DrillStatus.PASSED, DrillStatus.FAILED, DrillStatus.ERROR},
    DrillStatus.PASSED: set(),
    DrillStatus.FAILED: set(),
    DrillStatus.ERROR: set(),
}
FINISHED_DRILL_STATUSES = tuple(s for s, exits in DRILL_TRANSITIONS.items() if not exits)
OPEN_DRILL_STATUSES = tuple(s for s in DRILL_TRANSITIONS if s not in FINISHED_DRILL_STATUSES)


class DrillRun(models.Model):
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="drill_runs")
    scenario = models.CharField(max_length=64)  # a key of breakers.drills.scenarios.SCENARIOS
    status = models.CharField(
        max_length=16, choices=DrillStatus.choices, default=DrillStatus.QUEUED
    )
    # The team's rule-set version the drill ran against (wired by the rule-set versions).
    ruleset_version = models.PositiveIntegerField(null=True, blank=True)
    # Scenarios started together share it (``manage.py drill --scenario all``).
    drill_set = models.UUIDField(default=uuid.uuid4, db_index=True)
    job = models.ForeignKey(
        Job, on_delete=models.PROTECT, null=True, blank=True, related_name="drill_runs"
    )
    executor = models.CharField(max_length=16, default="local")  # local / slurm
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    # Test hook of the checker itself: the checkpoint is damaged before the "loads" line.
    corrupt_checkpoint = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    fault_step = models.BigIntegerField(null=True, blank=True)
    # Headline figures (seconds and steps to detect and to brake) for the trend chart.
    detect_seconds = models.FloatField(null=True, blank=True)
    brake_seconds = models.FloatField(null=True, blank=True)
    brake_steps = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    # The drill schedule's key (team, rule-set version, period) on the runs it queued; blank
    # when a person or the command line asked. Unique per scenario: two beats (or a retry)
    # racing past the "already drilled this period" check still queue each set once.
    schedule_key = models.CharField(max_length=100, blank=True, default="")
    # When the set's failure was paged (a scheduled set pages once, however often asked).
    failure_paged_at = models.DateTimeField(null=True, blank=True)
    # The team's own training and verify commands as they were when the drill was asked for
    # (blank: the built-in workload); the report says what ran, whatever changes later.
    command = models.TextField(blank=True, default="")
    verify_command = models.TextField(blank=True, default="")

    class Meta:
        indexes = [
            models.Index(fields=["team", "scenario", "status"], name="drill_team_scenario"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule_key", "scenario"],
                condition=~models.Q(schedule_key=""),
                name="drill_scheduled_once",
            )
        ]

    def __str__(self) -> str:
        return f"drill {self.scenario} #{self.pk} of {self.team_id} ({self.status})"

    @property
    def passed(self) -> bool:
        return self.status == DrillStatus.PASSED

    @property
    def scheduled(self) -> bool:
        """Queued by the drill schedule (nobody watches it: its failure pages)."""
        return bool(self.schedule_key)


class DrillCheck(AppendOnlyModel):
    """One scorecard line: what was checked, its measured figure and the expectation."""

    append_only_noun = "Drill scorecard lines"
    objects = AppendOnlyQuerySet.as_manager()

    run = models.ForeignKey(DrillRun, on_delete=models.PROTECT, related_name="checks")
    position = models.PositiveIntegerField()
    name = models.CharField(max_length=64)
    passed = models.BooleanField()
    measured = models.CharField(max_length=200)
    expectation = models.CharField(max_length=200)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="drill_check_position")
        ]

    def __str__(self) -> str:
        return f"{self.name}: {'pass' if self.passed else 'FAIL'} ({self.measured})"


class DrillWorkload(models.Model):
    """A team's own training command for its drills, instead of the built-in workload (admins
    set it, and only where the operator allows it: it runs on the console's machine or its
    Slurm). ``verify_command`` is the scorecard's "loads" check: a fresh process that reads
    ``{"path", "sha256"}`` on standard input, restores that checkpoint, runs one step and prints
    one JSON line ``{"loads": true, ...}``. Both are argument lists in shell syntax (split with
    ``shlex``, never run by a shell)."""

    team = models.OneToOneField(Team, on_delete=models.CASCADE, related_name="drill_workload")
    command = models.TextField()
    verify_command = models.TextField()
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"drill workload of {self.team_id}: {self.command[:60]}"
