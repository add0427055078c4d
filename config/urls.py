"""The project's root URLconf: everything is the console's (the web layer owns its routes)."""

from django.urls import include, path

urlpatterns = [path("", include("console.urls"))]

# An /api/ path that matches no route answers the API's JSON error body, not an HTML page.
handler404 = "console.api.errors.not_found"
handler500 = "console.api.errors.server_error"
