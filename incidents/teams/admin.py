"""Admin pages of the authorisation chain (imported by ``incidents.admin``).

The audit trail and escalation requests are records: shown, never edited here. Shifts are
plain data; tokens are shown by prefix only and can be revoked through the API.
"""

from django.contrib import admin

from incidents.admin_read_only import ReadOnlyAdmin
from incidents.models import (
    AuditEntry,
    EscalationRequest,
    OnCallRotation,
    OnCallShift,
    PersonalToken,
)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = [
        "at",
        "user",
        "team",
        "action",
        "target_type",
        "target_id",
        "allowed",
        "outcome_code",
    ]
    list_filter = ["allowed", "action", "outcome_code", "via"]
    search_fields = ["reason", "outcome"]


@admin.register(EscalationRequest)
class EscalationRequestAdmin(ReadOnlyAdmin):
    list_display = ["id", "job", "command_kind", "level", "status", "requested_by", "decided_by"]
    list_filter = ["status", "command_kind"]


@admin.register(OnCallShift)
class OnCallShiftAdmin(admin.ModelAdmin):
    list_display = ["team", "user", "starts_at", "ends_at"]
    list_filter = ["team"]


@admin.register(OnCallRotation)
class OnCallRotationAdmin(ReadOnlyAdmin):
    """Read-only: rotations are arranged on the team's Paging page (audited, validated)."""

    list_display = ("team", "name", "length_days", "handoff_time", "time_zone", "starts_on")


@admin.register(PersonalToken)
class PersonalTokenAdmin(ReadOnlyAdmin):
    list_display = ["prefix", "user", "name", "created_at", "last_used_at", "revoked_at"]
