from django.contrib import admin

from breakers.models import EvaluationState, Rule


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    """Rules are edited here. A row is validated by building the engine's RuleSpec (clean()),
    so an invalid detector parameter is refused with the engine's own message."""

    list_display = ["key", "team", "name", "layer", "severity", "action", "detector", "enabled"]
    list_filter = ["team", "layer", "severity", "enabled"]
    list_editable = ["enabled"]
    search_fields = ["key", "name", "metric"]
    readonly_fields = ["updated_at"]
    fieldsets = [
        (None, {"fields": ["team", "key", "name", "enabled", "updated_at"]}),
        ("What it watches", {"fields": ["layer", "metric", "per_metric", "per_node"]}),
        ("Detector", {"fields": ["detector", "params", "clear_after", "clear_after_seconds"]}),
        ("Response", {"fields": ["severity", "action", "action_params", "runbook"]}),
    ]


@admin.register(EvaluationState)
class EvaluationStateAdmin(admin.ModelAdmin):
    """Read-only: the evaluator's own bookkeeping (editing the cursor would skip or repeat)."""

    list_display = ["job", "cursor", "points_evaluated", "rules_fingerprint", "updated_at"]
    readonly_fields = [
        "job",
        "cursor",
        "points_evaluated",
        "rules_fingerprint",
        "last_tick",
        "updated_at",
        "state",
    ]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


# --- Jobs on Slurm (issue 10) ---------------------------------------------------------------

from breakers.models import NodeDrain, SchedulerBinding  # noqa: E402


@admin.register(SchedulerBinding)
class SchedulerBindingAdmin(admin.ModelAdmin):
    """The job's executor setting. Heartbeats fill the Slurm context and switch the executor to
    Slurm on their own; choosing the executor here pins it (heartbeats then leave it alone)."""

    list_display = ["job", "executor", "executor_pinned", "slurm_job_id", "slurm_nodelist"]
    list_filter = ["executor", "executor_pinned", "requeue_after_drain"]
    search_fields = ["job__name", "slurm_job_id", "slurm_nodelist"]
    readonly_fields = ["updated_at"]

    def save_model(self, request, obj, form, change) -> None:
        if "executor" in form.changed_data:
            obj.executor_pinned = True
        super().save_model(request, obj, form, change)


@admin.register(NodeDrain)
class NodeDrainAdmin(admin.ModelAdmin):
    """Read-only: a node returns to service through the console (POST /api/v1/nodes/<id>/resume),
    which also resumes it in Slurm and writes the timeline."""

    list_display = ["slurm_node", "node", "reason", "drained_at", "returned_at", "returned_by"]
    list_filter = ["returned_at"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
