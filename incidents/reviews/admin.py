"""Admin pages of the review records. A job's size may be declared here (as with create_job or
the API: a person's entry is declared, and replaces what the job reported); reviews are only
shown (edits go through ``incidents.reviews.writeup.save_review``, which keeps every revision)."""

from __future__ import annotations

from django.contrib import admin

from incidents.job_size import declare_job_size
from incidents.models import JobSize, Review


@admin.register(JobSize)
class JobSizeAdmin(admin.ModelAdmin):
    list_display = ["job", "nodes", "gpus_per_node", "accelerator", "source", "declared_at"]
    list_filter = ["source"]
    search_fields = ["job__name"]
    readonly_fields = ["source"]

    def save_model(self, request, obj, form, change) -> None:
        # Through the one service: checked, and what a person enters is declared.
        declare_job_size(
            obj.job_id,
            nodes=obj.nodes,
            gpus_per_node=obj.gpus_per_node,
            accelerator=obj.accelerator,
        )


@admin.register(Review)
class ReviewAdmin(admin.ModelAdmin):
    list_display = ["incident", "status", "revision", "updated_by", "updated_at"]
    list_filter = ["status"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
