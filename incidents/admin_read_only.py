"""The admin's page for records that change only through their services: shown, never edited.
Every admin module of the incidents app builds its record pages on it."""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Alerts, incidents and timelines change only through their services (transitions with
    timeline rows); the admin shows them."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
