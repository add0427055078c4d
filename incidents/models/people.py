"""The authorisation chain's records: on-call shifts, escalation requests, pause confirmations,
the audit trail and personal API tokens (docs/design.md "The authorisation chain").

Imported at the end of ``incidents.models`` so Django registers them with the app; import them
from there. Commands live in ``breakers``, which ``incidents`` never imports: a command is
referred to by its plain id (``command_id``), never by a foreign key.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from core.append_only import AppendOnlyModel, AppendOnlyQuerySet
from incidents.models.alerts import Alert, Incident, Severity
from incidents.models.jobs import Job, Team, hash_token

__all__ = [
    "ACTIVE_ESCALATION_STATUSES",
    "ESCALATION_TRANSITIONS",
    "PERSONAL_TOKEN_PREFIX",
    "AuditEntry",
    "EscalationRequest",
    "EscalationStatus",
    "OnCallRotation",
    "OnCallShift",
    "OnExpiry",
    "PauseConfirmation",
    "PauseDecision",
    "PersonalToken",
]

# Distinct from agent tokens ("bkl_"): a bearer token tells at a glance whom it belongs to, and
# an agent token sent to a person's endpoint is never mistaken for a personal one.
PERSONAL_TOKEN_PREFIX = "bkp_"


def created_by_field() -> models.ForeignKey:
    """Who arranged an on-call shift or rotation (kept when they leave)."""
    return models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )


class OnCallShift(models.Model):
    """Who is on call for a team, from when to when. A shift decides who is paged first; it
    grants no authority (that is the person's role in the team)."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="shifts")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oncall_shifts"
    )
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    created_by = created_by_field()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["starts_at", "id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(ends_at__gt=F("starts_at")), name="shift_ends_after_it_starts"
            )
        ]
        indexes = [models.Index(fields=["team", "starts_at", "ends_at"], name="shift_team_time")]

    def __str__(self) -> str:
        return f"{self.user} on call for {self.team} {self.starts_at:%Y-%m-%d %H:%M}–{self.ends_at}"


class OnCallRotation(models.Model):
    """People taking the pager in turn, ``length_days`` each (7: weekly), handing it over at
    ``handoff_time`` in the IANA zone ``time_zone``, the first turn beginning on ``starts_on``
    (incidents.teams.rotation). Shifts (OnCallShift) override it: "I take Tuesday night"."""

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="rotations")
    name = models.CharField(max_length=100)
    # User ids in turn order (a JSON list: SQLite and PostgreSQL alike); people who left the
    # team or can no longer acknowledge are skipped when the pager is theirs.
    people = models.JSONField(default=list)
    length_days = models.PositiveIntegerField(default=7)
    handoff_time = models.TimeField()
    time_zone = models.CharField(max_length=64, default="UTC")
    starts_on = models.DateField()
    created_by = created_by_field()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(condition=Q(length_days__gte=1), name="rotation_turn_length"),
            models.UniqueConstraint(fields=["team", "name"], name="one_rotation_name_per_team"),
        ]

    def __str__(self) -> str:
        return f"rotation {self.name!r} of {self.team}"


class EscalationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"  # the command was issued in the same transaction
    REJECTED = "rejected", "Rejected"
    EXPIRED = "expired", "Expired"  # nobody decided within the policy time


ESCALATION_TRANSITIONS: dict[str, set[str]] = {
    EscalationStatus.PENDING: {
        EscalationStatus.APPROVED,
        EscalationStatus.REJECTED,
        EscalationStatus.EXPIRED,
    },
    EscalationStatus.APPROVED: set(),
    EscalationStatus.REJECTED: set(),
    EscalationStatus.EXPIRED: set(),
}
ACTIVE_ESCALATION_STATUSES = (EscalationStatus.PENDING,)


class OnExpiry(models.TextChoices):
    NOTIFY = "notify", "Notify the next manager"
    AUTO_L3 = "auto_l3", "Checkpoint and pause automatically (L3)"


class EscalationRequest(models.Model):
    """On-call asks for an action stronger than the rule's soft mitigation; a manager decides.

    ``level`` is the alert's severity when the request was made: the authority decides the
    request and its approval at that level.
    """

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="escalations")
    alert = models.ForeignKey(
        Alert, on_delete=models.PROTECT, null=True, blank=True, related_name="escalations"
    )
    incident = models.ForeignKey(
        Incident, on_delete=models.PROTECT, null=True, blank=True, related_name="escalations"
    )
    level = models.CharField(max_length=2, choices=Severity.choices, blank=True)
    command_kind = models.CharField(max_length=32)
    command_params = models.JSONField(default=dict, blank=True)
    reason = models.TextField()
    on_expiry = models.CharField(max_length=16, choices=OnExpiry.choices, default=OnExpiry.NOTIFY)
    status = models.CharField(
        max_length=16, choices=EscalationStatus.choices, default=EscalationStatus.PENDING
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    requested_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_note = models.TextField(blank=True)
    # breakers.Command id of the command issued on approval (or on an automatic L3 expiry).
    command_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            # Two on-call engineers asking for the same thing at once: one request, not two
            # (approving both would send the command twice).
            models.UniqueConstraint(
                fields=["job", "command_kind"],
                condition=Q(status="pending"),
                name="one_pending_escalation_per_job_and_kind",
            )
        ]
        indexes = [
            models.Index(fields=["status", "expires_at"], name="escalation_due"),
            models.Index(fields=["job", "status"], name="escalation_job_status"),
        ]

    def __str__(self) -> str:
        return f"escalation #{self.pk} {self.command_kind} on {self.job_id} ({self.status})"


class PauseDecision(models.TextChoices):
    KEEP_PAUSED = "keep_paused", "Keep paused"
    RESUME = "resume", "Resume"
    ROLL_BACK = "roll_back", "Roll back to a checkpoint and resume"


class PauseConfirmation(models.Model):
    """A person's confirmation of one pause. One per pause command: the unique index makes the
    first of two simultaneous confirmations win and the other a 409."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="pause_confirmations")
    pause_command_id = models.BigIntegerField(unique=True)  # breakers.Command id
    level = models.CharField(max_length=2, choices=Severity.choices, blank=True)
    decision = models.CharField(max_length=16, choices=PauseDecision.choices)
    checkpoint = models.CharField(max_length=1000, blank=True)
    reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField()
    command_id = models.BigIntegerField(null=True, blank=True)  # the resume command, if any

    def __str__(self) -> str:
        return f"{self.decision} of pause #{self.pause_command_id}"


class AuditEntry(AppendOnlyModel):
    """One attempt to act, allowed or refused: who, what, when, from where, and the outcome.

    Append-only, enforced three times like the timeline: here (save and delete refuse), in the
    queryset (update and delete refuse) and, on PostgreSQL, by a trigger (migration 0006).
    """

    at = models.DateTimeField()
    # PROTECT, not SET_NULL: nulling the column would be an UPDATE the trigger refuses.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    actor_kind = models.CharField(max_length=8, default="person")  # incidents.models.ActorKind
    team = models.ForeignKey(
        Team, on_delete=models.PROTECT, null=True, blank=True, related_name="audit_entries"
    )
    role = models.CharField(max_length=16, blank=True)  # the actor's role then; "" for none
    # An incidents.teams.authority.Action value, or one of the few outside the matrix:
    # issue_token, revoke_token, read_audit.
    action = models.CharField(max_length=32)
    target_type = models.CharField(max_length=32)
    target_id = models.BigIntegerField(null=True, blank=True)
    level = models.CharField(max_length=2, blank=True)
    allowed = models.BooleanField()
    reason = models.TextField(blank=True)  # the authority's sentence
    outcome_code = models.CharField(max_length=32)  # "ok" or the error code of the answer
    outcome = models.TextField(blank=True)
    remote_addr = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=300, blank=True)
    via = models.CharField(max_length=16, blank=True)  # session, token, system, command

    append_only_noun = "Audit entries"
    objects = AppendOnlyQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["team", "at"], name="audit_team_at"),
            models.Index(fields=["user", "at"], name="audit_user_at"),
        ]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        verdict = "allowed" if self.allowed else "refused"
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.user} {self.action} {verdict}: {self.outcome}"


class PersonalToken(models.Model):
    """A person's API token for scripts, stored hashed like agent tokens and shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="personal_tokens"
    )
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to recognise it.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… of {self.user} ({self.name})"

    @classmethod
    def issue(cls, user, name: str) -> tuple[PersonalToken, str]:
        """Create a token for ``user``; the raw token is returned once and never stored."""
        raw = PERSONAL_TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(
            user=user, name=name, token_hash=hash_token(raw), prefix=raw[:12]
        )
        return token, raw
