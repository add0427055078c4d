"""Websocket routes (the agent's command push and the console's live pages)."""

from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from console.consumers import AgentConsumer
from console.live import ConsoleConsumer

websocket_urlpatterns = [
    # channels routes ASGI applications through Django's path(); django-stubs types it for views
    # only.
    path("ws/agent/", AgentConsumer.as_asgi()),  # type: ignore[arg-type]
    # A browser's socket, authenticated by its session cookie: only from a page of ours (the
    # Origin among ALLOWED_HOSTS), or any site could open it with the person's cookie.
    path("ws/live/", AllowedHostsOriginValidator(ConsoleConsumer.as_asgi())),
]
