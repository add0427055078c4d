"""Websocket routes (the agent's command push and the console's live pages)."""

websocket_urlpatterns: list = []
