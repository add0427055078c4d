"""Websocket routes (the agent's command push and the console's live pages)."""

from django.urls import path

from console.consumers import AgentConsumer
from console.live import ConsoleConsumer

websocket_urlpatterns = [
    path("ws/agent/", AgentConsumer.as_asgi()),
    path("ws/live/", ConsoleConsumer.as_asgi()),
]
