"""Commands to running jobs: the control plane's stored records (docs/design.md, "The control
plane")."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from incidents.models import ActorKind, Alert, Job

__all__ = [
    "ActorKind",
    "Command",
    "CommandAck",
    "CommandKind",
    "CommandStatus",
    "Hearing",
    "WebBeacon",
]


class CommandKind(models.TextChoices):
    LOWER_LR = "lower_lr", "Lower the learning rate"
    PAUSE_DATA = "pause_data", "Pause data loading"
    CHECKPOINT_AND_PAUSE = "checkpoint_and_pause", "Checkpoint and pause"
    RESUME = "resume", "Resume"
    TERMINATE = "terminate", "Terminate"
    ISOLATE_NODE = "isolate_node", "Isolate node"
    INJECT_FAULT = "inject_fault", "Inject a fault (drill sandboxes only)"


class CommandStatus(models.TextChoices):
    PENDING = "pending", "Pending"  # stored, not yet known to have reached the job
    DELIVERED = "delivered", "Delivered"  # pushed over the websocket or in a reply
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    EXPIRED = "expired", "Expired"  # not acknowledged in time: the job is presumed hung


COMMAND_TRANSITIONS: dict[str, set[str]] = {
    # An ack may overtake the delivery record (reply lost, websocket raced): pending → done.
    CommandStatus.PENDING: {
        CommandStatus.DELIVERED,
        CommandStatus.SUCCEEDED,
        CommandStatus.FAILED,
        CommandStatus.EXPIRED,
    },
    CommandStatus.DELIVERED: {CommandStatus.SUCCEEDED, CommandStatus.FAILED, CommandStatus.EXPIRED},
    CommandStatus.SUCCEEDED: set(),
    CommandStatus.FAILED: set(),
    # A hung job that wakes up and acknowledges late: the result is still recorded.
    CommandStatus.EXPIRED: {CommandStatus.SUCCEEDED, CommandStatus.FAILED},
}
OPEN_COMMAND_STATUSES = (CommandStatus.PENDING, CommandStatus.DELIVERED)


class Command(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=32, choices=CommandKind.choices)
    params = models.JSONField(default=dict, blank=True)
    severity = models.CharField(max_length=2, blank=True)
    reason = models.TextField()
    issued_by_kind = models.CharField(max_length=8, choices=ActorKind.choices)
    issued_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    alert = models.ForeignKey(
        Alert,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="commands",
        help_text="The alert that asked for it (automatic braking, approved escalations).",
    )
    # The same key twice is the same command: an alert processed by two workers, a double
    # click, a retried request. The unique constraint makes "exactly once" hold under races.
    idempotency_key = models.CharField(max_length=200)
    status = models.CharField(
        max_length=16, choices=CommandStatus.choices, default=CommandStatus.PENDING
    )
    issued_at = models.DateTimeField()
    deliver_by = models.DateTimeField(help_text="Unacknowledged after this, the job is hung.")
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The job's step when the command reached it: metrics far past it with no acknowledgement
    # mean the training loop never applies commands (breakers.control.unapplied).
    delivered_step = models.BigIntegerField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    # Multi-rank jobs: the step boundary at which every rank applies it (None: the first
    # boundary after it arrives), and when the first rank acknowledged it: some ranks acked,
    # others not, this long after is a split job (breakers.control.acks).
    apply_at_step = models.BigIntegerField(null=True, blank=True)
    first_ack_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "idempotency_key"], name="command_idempotent")
        ]
        indexes = [
            models.Index(fields=["job", "status"], name="command_job_status"),
            models.Index(fields=["status", "deliver_by"], name="command_deadline"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} to {self.job_id} ({self.status})"


class CommandAck(models.Model):
    """One rank's acknowledgement of a command (multi-rank jobs). The command itself succeeds
    only once every rank of the job's world size acknowledged it at the same step."""

    command = models.ForeignKey(Command, on_delete=models.CASCADE, related_name="rank_acks")
    rank = models.IntegerField()
    status = models.CharField(max_length=16, choices=CommandStatus.choices)
    step = models.BigIntegerField(null=True, blank=True)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    acknowledged_at = models.DateTimeField()

    class Meta:
        # A rank's second ack of the same command (a retried POST) is the first one.
        constraints = [
            models.UniqueConstraint(fields=["command", "rank"], name="command_ack_once_per_rank")
        ]
        ordering = ["command", "rank"]

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.command_id}: {self.status} at {self.step}"


class Hearing(models.Model):
    """The web tier's beacon: when the console could last hear its agents (one row).

    Every web process writes it about twice a second, on the database's clock; the watchdog
    judges silences and acknowledgement deadlines only up to it (breakers.control.hearing)."""

    heard_at = models.DateTimeField(help_text="The web tier's last beacon.")
    heard_since = models.DateTimeField(help_text="The end of the console's last deafness.")
    outages = models.PositiveIntegerField(default=0)
    deaf_seconds = models.FloatField(default=0.0, help_text="All deafness so far, summed.")
    last_gap_seconds = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"heard at {self.heard_at:%Y-%m-%d %H:%M:%S}"


class WebBeacon(models.Model):
    """One web process's part of the beacon: up to when it has heard its agents.

    A process that holds agent requests it has not served has heard only up to the oldest one's
    arrival; the console has heard up to the earliest of its live processes
    (breakers.control.hearing). A row whose process stopped beaconing stops counting and is
    removed by the next beacon of any other."""

    process = models.CharField(max_length=100, primary_key=True, help_text="host:pid:nonce")
    beat_at = models.DateTimeField(help_text="The process's last beacon (database clock).")
    heard_to = models.DateTimeField(help_text="The beacon less the oldest held request's age.")
    lag_seconds = models.FloatField(default=0.0, help_text="0 unless past the threshold.")
    peak_lag_seconds = models.FloatField(
        default=0.0, help_text="The current backlog's worst lag, forgiven when it clears."
    )

    def __str__(self) -> str:
        return f"{self.process}: lag {self.lag_seconds:.1f} s"
