"""The project's root URLconf: everything is the console's (the web layer owns its routes)."""

from django.urls import include, path

urlpatterns = [path("", include("console.urls"))]
