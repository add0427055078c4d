from typing import Any

from django import forms
from django.contrib import admin

from breakers.detection import ruleset_core, rulesets
from breakers.detection.engine import RuleSpec
from breakers.executors.targets import normalise_root
from breakers.models import (
    CheckpointRoot,
    EvaluationState,
    InferenceServer,
    NodeBinding,
    Rule,
)
from incidents.teams.audit import AuditContext


class RuleAdminForm(forms.ModelForm):
    """The default pack's rule, with the reason every version of a rule set carries."""

    why = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        max_length=rulesets.MAX_WHY,
        help_text="Why the rule changes: kept with the new version of every team's rule set.",
    )

    class Meta:
        model = Rule
        fields = list(Rule.SPEC_FIELDS)

    def change(self) -> dict[str, Any]:
        """The form as one change of ``rulesets.change_default_pack``."""
        names = [n for n in Rule.SPEC_FIELDS if n != "key" and n in self.fields]
        if self.instance.pk is None:
            fields = {n: self.cleaned_data[n] for n in names if n in self.cleaned_data}
            return {"op": "create", "key": self.cleaned_data.get("key"), "fields": fields}
        changed = [n for n in names if n in self.changed_data]
        return {
            "op": "update",
            "key": self.instance.key,
            "fields": {n: self.cleaned_data[n] for n in changed},
        }

    def clean(self) -> dict[str, Any]:
        """Refused here, on the form, what the service would refuse (nothing half-written)."""
        data = super().clean()
        if self.errors:
            return data
        change = self.change()
        if change["op"] == "update" and not change["fields"]:
            raise forms.ValidationError("Nothing changed.")
        try:
            defaults = {r.key: rulesets.row_fields(r) for r in Rule.objects.filter(team=None)}
            after = ruleset_core.apply_changes(defaults, {}, ruleset_core.parse_changes([change]))
        except ruleset_core.ChangeError as error:
            name = error.field.rsplit(".", 1)[-1]
            self.add_error(name if name in self.fields else None, str(error))
            return data
        if (
            change["op"] == "update"
            and _normalised(defaults[change["key"]]) == after[change["key"]]
        ):
            raise forms.ValidationError("Nothing changed.")  # the service would version nothing
        return data


def _normalised(fields: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return RuleSpec.from_dict(fields).to_dict()
    except (ValueError, TypeError):  # a row broken behind the admin's back: any fix is a change
        return None


@admin.register(Rule)
class RuleAdmin(admin.ModelAdmin):
    """The default pack is edited here, through ``rulesets.change_default_pack`` (a version of
    every team's rule set it changes, with the reason given). A row is validated by building
    the engine's RuleSpec, so an invalid detector parameter is refused with the engine's own
    message. A team's rows are read-only here: its admins edit them on the team's Rules page
    or through the API, under the authority matrix."""

    form = RuleAdminForm
    list_display = ["key", "team", "name", "layer", "severity", "action", "detector", "enabled"]
    list_filter = ["team", "layer", "severity", "enabled"]
    search_fields = ["key", "name", "metric"]
    fieldsets = [
        (None, {"fields": ["team", "key", "name", "enabled", "updated_at"]}),
        ("What it watches", {"fields": ["layer", "metric", "per_metric", "per_node"]}),
        ("Detector", {"fields": ["detector", "params", "clear_after", "clear_after_seconds"]}),
        ("Response", {"fields": ["severity", "action", "action_params", "runbook"]}),
        ("After an automatic L3 brake", {"fields": ["recovery", "recovery_budget"]}),
        ("Version", {"fields": ["why"]}),
    ]

    def get_readonly_fields(self, request, obj=None):  # type: ignore[no-untyped-def]
        # The owner and key of a row never change (that would be a delete and a create).
        return ["team", "updated_at"] if obj is None else ["team", "key", "updated_at"]

    def has_add_permission(self, request) -> bool:
        return bool(request.user.is_superuser)

    def has_change_permission(self, request, obj=None) -> bool:
        return bool(request.user.is_superuser) and (obj is None or obj.team_id is None)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a default rule is disabled, not deleted; a team's row on its page

    def save_model(self, request, obj, form, change) -> None:
        rulesets.change_default_pack(
            request.user,
            form.cleaned_data["why"],
            [form.change()],
            context=AuditContext(
                remote_addr=request.META.get("REMOTE_ADDR"),
                via="admin",
                user_agent=request.META.get("HTTP_USER_AGENT", ""),
            ),
        )
        saved = Rule.objects.get(team=None, key=form.change()["key"])
        obj.pk, obj.updated_at = saved.pk, saved.updated_at


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


# --- Jobs on Slurm --------------------------------------------------------------------------

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


# --- Rule set versions -------------------------------------------------------------------

from breakers.models import RuleSetVersion, ShadowFiring  # noqa: E402


@admin.register(RuleSetVersion)
class RuleSetVersionAdmin(admin.ModelAdmin):
    """Read-only: versions are append-only records (the database refuses edits anyway)."""

    list_display = ["team", "number", "created_at", "actor", "summary"]
    list_filter = ["team"]
    search_fields = ["why", "summary"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ShadowFiring)
class ShadowFiringAdmin(admin.ModelAdmin):
    """Read-only: what shadow rules would have done, written by the evaluation alone."""

    list_display = ["job", "rule_key", "severity", "action", "fired_step", "fired_at", "cleared_at"]
    list_filter = ["rule_key", "severity"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


# --- Declarations: what an executor may act on for a job (breakers.executors.targets) ---------


class _Declared(admin.ModelAdmin):
    readonly_fields = ["declared_by", "declared_at"]

    def save_model(self, request, obj, form, change) -> None:
        obj.declared_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(InferenceServer)
class InferenceServerAdmin(_Declared):
    """The load balancer servers of an inference job: the traffic executor acts on no other."""

    list_display = ["job", "backend", "server", "declared_by", "declared_at"]
    search_fields = ["job__name", "backend", "server"]


class CheckpointRootForm(forms.ModelForm):
    class Meta:
        model = CheckpointRoot
        fields = ["team", "job", "root"]

    def clean_root(self) -> str:
        try:
            return normalise_root(self.cleaned_data["root"])
        except ValueError as error:
            raise forms.ValidationError(str(error)) from None


@admin.register(CheckpointRoot)
class CheckpointRootAdmin(_Declared):
    """Where a team's (or one job's) checkpoints must live."""

    form = CheckpointRootForm
    list_display = ["team", "job", "root", "declared_by", "declared_at"]
    search_fields = ["team__name", "job__name", "root"]


@admin.register(NodeBinding)
class NodeBindingAdmin(_Declared):
    """The node inventory: an operator binds a node to a job. Hardware alerts on a node only
    the job's agent named page people but never isolate or terminate anything by themselves."""

    list_display = ["job", "hostname", "source", "declared_by", "declared_at"]
    list_filter = ["source"]
    search_fields = ["job__name", "hostname"]
