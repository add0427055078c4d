"""Alerts, incidents and their timeline (docs/design.md "What an alert must carry", "Alerts and
incidents")."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from core.append_only import AppendOnlyError, AppendOnlyModel, AppendOnlyQuerySet  # noqa: F401
from core.fields import NonFiniteFloatField
from incidents.models.jobs import Job


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
    # Who handles the episode (taken by on-call, or handed to a team member); NULL: nobody yet.
    assignee = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    assigned_at = models.DateTimeField(null=True, blank=True)
    # A person took the incident over from automatic recovery: its next brakes hold for them.
    taken_over_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    taken_over_at = models.DateTimeField(null=True, blank=True)

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
    # No page for this alert until then (incidents.alerts.snooze): a matter of the clock, like a
    # silence, so no status of its own; the brakes never look at it. Only at the level it was
    # snoozed at: a rise in severity pages.
    snoozed_until = models.DateTimeField(null=True, blank=True)
    snoozed_level = models.CharField(max_length=2, choices=Severity.choices, blank=True)
    snoozed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )

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


# A NOTE row's data["event"] when the system's own brake for an alert was refused (written by
# breakers.control.braking, read by the page: it must not say "paused" for a refused pause).
SYSTEM_COMMAND_REFUSED = "system_command_refused"


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
