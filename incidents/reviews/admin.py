"""Admin pages of the review records. A job's declared size is entered here; reviews are only
shown (edits go through ``incidents.reviews.writeup.save_review``, which keeps every revision)."""

from __future__ import annotations

from django.contrib import admin

from incidents.models import JobSize, Review


@admin.register(JobSize)
class JobSizeAdmin(admin.ModelAdmin):
    list_display = ["job", "nodes", "gpus_per_node", "accelerator", "declared_at"]
    search_fields = ["job__name"]


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
