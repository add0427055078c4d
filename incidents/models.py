"""Teams, roles, jobs, nodes and agent tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models

# AppendOnlyError is re-exported: callers catch it from here.
from incidents.append_only import AppendOnlyError, AppendOnlyModel, AppendOnlyQuerySet  # noqa: F401
from incidents.fields import NonFiniteFloatField

TOKEN_PREFIX = "bkl_"


class Role(models.TextChoices):
    # Ordered: each role may do everything the one before it may (see incidents.authority).
    VIEWER = "viewer", "Viewer"
    ONCALL = "oncall", "On-call"
    MANAGER = "manager", "Manager"
    ADMIN = "admin", "Admin"


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_role_per_team")]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.team}"


class JobKind(models.TextChoices):
    TRAINING = "training", "Training"
    INFERENCE = "inference", "Inference"


class JobStatus(models.TextChoices):
    PENDING = "pending", "Pending"  # created, the agent has not spoken yet
    RUNNING = "running", "Running"
    PAUSING = "pausing", "Pausing"  # checkpoint_and_pause issued, not yet confirmed saved
    PAUSED = "paused", "Paused"
    TERMINATED = "terminated", "Terminated"
    FINISHED = "finished", "Finished"


JOB_TRANSITIONS: dict[str, set[str]] = {
    JobStatus.PENDING: {
        JobStatus.RUNNING,
        JobStatus.PAUSING,
        JobStatus.TERMINATED,
        JobStatus.FINISHED,
    },
    JobStatus.RUNNING: {
        JobStatus.PAUSING,
        JobStatus.PAUSED,
        JobStatus.TERMINATED,
        JobStatus.FINISHED,
    },
    JobStatus.PAUSING: {JobStatus.PAUSED, JobStatus.RUNNING, JobStatus.TERMINATED},
    JobStatus.PAUSED: {JobStatus.RUNNING, JobStatus.TERMINATED},
    JobStatus.TERMINATED: set(),
    JobStatus.FINISHED: set(),
}


class AgentStatus(models.TextChoices):
    """What the training process last said of itself in a heartbeat."""

    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    CHECKPOINTING = "checkpointing", "Checkpointing"
    FINISHED = "finished", "Finished"


class Job(models.Model):
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=JobKind.choices, default=JobKind.TRAINING)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    agent_status = models.CharField(max_length=16, choices=AgentStatus.choices, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_metric_at = models.DateTimeField(null=True, blank=True)
    current_step = models.BigIntegerField(null=True, blank=True)
    # Step and time of the last heartbeat, kept apart from current_step (which metrics move
    # too) so the step time is measured between two heartbeats only.
    last_heartbeat_step = models.BigIntegerField(null=True, blank=True)
    # Seconds per training step, measured from successive heartbeats (moving average).
    step_time_seconds = models.FloatField(null=True, blank=True)
    # When the next heartbeat is due at the latest; the watchdog's one indexed query reads it.
    heartbeat_deadline = models.DateTimeField(null=True, blank=True, db_index=True)
    # Set when the watchdog raised the heartbeat alert of this silence (edge trigger: once per
    # episode); cleared by the next heartbeat, which also resolves that alert.
    heartbeat_overdue_since = models.DateTimeField(null=True, blank=True)
    heartbeat_timeout_seconds = models.FloatField(
        null=True, blank=True, help_text="Leave empty for the default: 8x the measured step time."
    )
    agent_pid = models.IntegerField(null=True, blank=True)
    agent_hostname = models.CharField(max_length=255, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="job_name_unique_in_team")
        ]

    def __str__(self) -> str:
        return f"{self.team.name}/{self.name}"


class NodeStatus(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    FAILED = "failed", "Failed"
    ISOLATED = "isolated", "Isolated"


class Node(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="nodes")
    hostname = models.CharField(max_length=200)
    rank = models.IntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.HEALTHY)
    first_seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "hostname"], name="node_unique_in_job")
        ]

    def __str__(self) -> str:
        return self.hostname


def hash_token(raw_token: str) -> str:
    # Agent tokens are 256-bit random strings, so a fast unsalted hash is safe here (no
    # dictionary to attack), and it keeps per-request authentication to one index lookup.
    return hashlib.sha256(raw_token.encode()).hexdigest()


class AgentToken(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to recognise it.")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… for {self.job}"

    @classmethod
    def issue(cls, job: Job) -> tuple[AgentToken, str]:
        """Create a token for ``job``; the raw token is returned once and never stored."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(job=job, token_hash=hash_token(raw), prefix=raw[:12])
        return token, raw


# --- Alerts, incidents and their timeline (docs/design.md "Alerts and incidents") ----------


class Severity(models.TextChoices):
    # The values sort in severity order, so SQL can compare them ("raise the level if lower").
    L1 = "L1", "L1 notice"
    L2 = "L2", "L2 warning"
    L3 = "L3", "L3 severe"
    L4 = "L4", "L4 fatal"


class Layer(models.TextChoices):
    HEALTH = "health", "Health"
    STABILITY = "stability", "Stability"
    PERFORMANCE = "performance", "Performance"


class AlertStatus(models.TextChoices):
    FIRING = "firing", "Firing"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"  # a person has seen it; still active
    RESOLVED = "resolved", "Resolved"


ALERT_TRANSITIONS: dict[str, set[str]] = {
    AlertStatus.FIRING: {AlertStatus.ACKNOWLEDGED, AlertStatus.RESOLVED},
    AlertStatus.ACKNOWLEDGED: {AlertStatus.RESOLVED},
    AlertStatus.RESOLVED: set(),
}
ACTIVE_ALERT_STATUSES = (AlertStatus.FIRING, AlertStatus.ACKNOWLEDGED)


class IncidentStatus(models.TextChoices):
    OPEN = "open", "Open"
    MITIGATED = "mitigated", "Mitigated"  # braked (e.g. paused), the condition may persist
    RESOLVED = "resolved", "Resolved"  # every alert of the episode has resolved
    REVIEWED = "reviewed", "Reviewed"  # the post-mortem is written


INCIDENT_TRANSITIONS: dict[str, set[str]] = {
    IncidentStatus.OPEN: {IncidentStatus.MITIGATED, IncidentStatus.RESOLVED},
    IncidentStatus.MITIGATED: {IncidentStatus.RESOLVED},
    # resolved → open: an alert whose condition began before the episode ended belongs to it
    # (a divergence's L1 notice clears, then its L2 "sustained for 10 minutes" fires).
    IncidentStatus.RESOLVED: {IncidentStatus.REVIEWED, IncidentStatus.OPEN},
    IncidentStatus.REVIEWED: set(),
}
# One job episode = one active incident: new alerts of the job attach to it.
ACTIVE_INCIDENT_STATUSES = (IncidentStatus.OPEN, IncidentStatus.MITIGATED)


class Incident(models.Model):
    """The alerts of one job episode, with the append-only timeline of what happened.

    An episode runs from the first anomalous point until the last of its alerts resolves; a new
    alert whose condition began at or before that step still belongs to it (the incident is
    reopened), a later one opens a new incident.
    """

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="incidents")
    title = models.CharField(max_length=300)
    status = models.CharField(
        max_length=16, choices=IncidentStatus.choices, default=IncidentStatus.OPEN
    )
    level = models.CharField(max_length=2, choices=Severity.choices)  # max severity so far
    opened_at = models.DateTimeField()
    first_step = models.BigIntegerField(help_text="First anomalous point of the episode.")
    first_time = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    # Step at which the episode's last condition cleared (the job's own clock, so replays and
    # backfills group alike); NULL while active or when it was not resolved by a clear.
    resolved_step = models.BigIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            # Two writers (the evaluator and the heartbeat watchdog) opening an incident for the
            # same job at once: the loser's insert fails and it attaches to the winner's.
            models.UniqueConstraint(
                fields=["job"],
                condition=models.Q(status__in=ACTIVE_INCIDENT_STATUSES),
                name="one_active_incident_per_job",
            )
        ]
        indexes = [models.Index(fields=["job", "status"], name="incident_job_status")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.level} {self.title} ({self.status})"


class Alert(models.Model):
    """One condition of one rule on one job (and node), from firing to resolved.

    Carries everything docs/design.md "What an alert must carry" lists; the job's id and name
    come through ``job``. ``fingerprint`` is (job, rule, node): at most one active alert per
    fingerprint.
    """

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="alerts")
    # NULL for performance-layer alerts: recorded for the daily digest, never an incident.
    incident = models.ForeignKey(
        Incident, on_delete=models.PROTECT, null=True, blank=True, related_name="alerts"
    )
    fingerprint = models.CharField(max_length=64, db_index=True)
    rule_key = models.CharField(max_length=100)
    rule_name = models.CharField(max_length=200)
    node = models.CharField(max_length=200, blank=True)  # "" when the rule pools the nodes
    nodes = models.JSONField(default=list, blank=True)  # nodes implicated (node failures)
    status = models.CharField(
        max_length=16, choices=AlertStatus.choices, default=AlertStatus.FIRING
    )
    severity = models.CharField(max_length=2, choices=Severity.choices)
    layer = models.CharField(max_length=16, choices=Layer.choices)
    metric = models.CharField(max_length=200)
    value = NonFiniteFloatField()
    threshold = models.FloatField(null=True, blank=True)
    description = models.TextField()
    first_step = models.BigIntegerField(help_text="First anomalous point (time to detect).")
    first_time = models.DateTimeField()
    step = models.BigIntegerField(help_text="Step of the latest observation of the condition.")
    raised_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    duration_seconds = models.FloatField(default=0.0)
    duration_steps = models.BigIntegerField(default=0)
    # The rule's action: what the system does (L2-L4, issued by the control plane) or proposes.
    action = models.CharField(max_length=32)
    action_params = models.JSONField(default=dict, blank=True)
    runbook_key = models.CharField(max_length=64)
    runbook_suggestion = models.CharField(max_length=200)  # one line, fits an SMS
    runbook = models.JSONField(default=dict)  # the whole runbook entry
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["fingerprint"],
                condition=models.Q(status__in=ACTIVE_ALERT_STATUSES),
                name="one_active_alert_per_fingerprint",
            )
        ]
        indexes = [models.Index(fields=["job", "status"], name="alert_job_status")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.severity} {self.rule_key} on {self.job_id} ({self.status})"


class TimelineKind(models.TextChoices):
    FIRST_ANOMALOUS_POINT = "first_anomalous_point", "First anomalous point"
    ALERT_RAISED = "alert_raised", "Alert raised"
    SEVERITY_CHANGED = "severity_changed", "Severity changed"
    ALERT_RESOLVED = "alert_resolved", "Alert resolved"
    INCIDENT_RESOLVED = "incident_resolved", "Incident resolved"
    INCIDENT_REOPENED = "incident_reopened", "Incident reopened"
    NOTE = "note", "Note"
    # Written by later issues (notifications, control plane, review):
    NOTIFICATION_SENT = "notification_sent", "Notification sent"
    NOTIFICATION_DELIVERED = "notification_delivered", "Notification delivered"
    ACKNOWLEDGED = "acknowledged", "Acknowledged"
    ESCALATION_REQUESTED = "escalation_requested", "Escalation requested"
    ESCALATION_APPROVED = "escalation_approved", "Escalation approved"
    ESCALATION_REJECTED = "escalation_rejected", "Escalation rejected"
    COMMAND_ISSUED = "command_issued", "Command issued"
    COMMAND_ACKNOWLEDGED = "command_acknowledged", "Command acknowledged"
    CHECKPOINT_SAVED = "checkpoint_saved", "Checkpoint saved"
    RESOURCES_RELEASED = "resources_released", "Resources released"
    RESUMED = "resumed", "Resumed"
    TERMINATED = "terminated", "Terminated"


class ActorKind(models.TextChoices):
    SYSTEM = "system", "System"
    PERSON = "person", "Person"
    AGENT = "agent", "Agent"


class TimelineEntry(AppendOnlyModel):
    """One row of an incident's timeline. Append-only, enforced three times: here (save and
    delete refuse), in the queryset (update and delete refuse) and, on PostgreSQL, by a trigger
    that rejects UPDATE and DELETE from anyone (incidents migration 0003)."""

    incident = models.ForeignKey(Incident, on_delete=models.PROTECT, related_name="timeline")
    alert = models.ForeignKey(
        Alert, on_delete=models.PROTECT, null=True, blank=True, related_name="timeline"
    )
    at = models.DateTimeField()
    kind = models.CharField(max_length=32, choices=TimelineKind.choices)
    actor_kind = models.CharField(max_length=8, choices=ActorKind.choices, default=ActorKind.SYSTEM)
    # PROTECT, not SET_NULL: nulling the column would be an UPDATE the trigger refuses.
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    step = models.BigIntegerField(null=True, blank=True)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)

    append_only_noun = "Timeline entries"
    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["incident", "at"], name="timeline_incident_at")]
        verbose_name_plural = "timeline entries"

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.kind}: {self.message}"


# The authorisation chain's models (shifts, escalations, audit, personal tokens) live in their
# own module; imported here so Django registers them with this app.
from incidents.authz_models import (  # noqa: E402, F401
    ACTIVE_ESCALATION_STATUSES,
    ESCALATION_TRANSITIONS,
    PERSONAL_TOKEN_PREFIX,
    AuditEntry,
    EscalationRequest,
    EscalationStatus,
    OnCallShift,
    OnExpiry,
    PauseConfirmation,
    PauseDecision,
    PersonalToken,
)
from incidents.review_models import FollowUp, JobSize, Review, ReviewRevision  # noqa: E402, F401

from incidents.notify_models import *  # noqa: E402, F401, F403  # isort: skip  (issue 8)
