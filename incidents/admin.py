from django.contrib import admin

from incidents.models import AgentToken, Job, Membership, Node, Team


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


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["hostname", "job", "rank", "status"]


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "job", "created_at", "revoked_at"]
    readonly_fields = ["token_hash", "prefix", "job", "created_at"]
