from django.contrib import admin

# The other admin modules of the app register their pages when imported: the authorisation
# chain's (audit trail, escalations, shifts, tokens) and the post-incident review's (job sizes,
# reviews). Django's admin autodiscovery imports only this module.
import incidents.reviews.admin  # noqa: F401
import incidents.teams.admin  # noqa: F401
from incidents.admin_read_only import ReadOnlyAdmin
from incidents.models import (
    AgentToken,
    Alert,
    Incident,
    Job,
    JobRank,
    Membership,
    Node,
    Team,
    TimelineEntry,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "created_at"]
    inlines = [MembershipInline]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "kind", "status", "current_step", "last_heartbeat_at"]
    list_filter = ["team", "kind", "status"]
    readonly_fields = ["status", "agent_status", "last_heartbeat_at", "current_step"]


@admin.register(JobRank)
class JobRankAdmin(admin.ModelAdmin):
    # Written by heartbeats only (incidents.heartbeats.record_heartbeat).
    list_display = ["job", "rank", "hostname", "pid", "step", "status", "last_heartbeat_at"]
    readonly_fields = [field.name for field in JobRank._meta.fields]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["hostname", "job", "rank", "status"]


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "job", "created_at", "revoked_at"]
    readonly_fields = ["token_hash", "prefix", "job", "created_at"]


class TimelineInline(admin.TabularInline):
    model = TimelineEntry
    fields = readonly_fields = ("at", "kind", "actor_kind", "actor", "step", "message")
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Incident)
class IncidentAdmin(ReadOnlyAdmin):
    list_display = ["id", "title", "job", "level", "status", "opened_at", "first_step"]
    list_filter = ["status", "level"]
    inlines = [TimelineInline]


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    list_display = ["id", "severity", "rule_key", "job", "node", "metric", "status", "raised_at"]
    list_filter = ["status", "severity", "layer"]
    search_fields = ["rule_key", "metric", "node"]


@admin.register(TimelineEntry)
class TimelineEntryAdmin(ReadOnlyAdmin):
    list_display = ["at", "incident", "kind", "actor_kind", "step", "message"]
    list_filter = ["kind", "actor_kind"]
