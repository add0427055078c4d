"""Realtime publishing: group names and "publish after commit".

The one piece both apps may import; it imports neither. Publishing goes through
``transaction.on_commit`` so nobody is ever shown a state that was rolled back.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


def team_group(team_id: int) -> str:
    return f"team.{team_id}"


def agent_group(job_id: int) -> str:
    """The training process's own websocket (commands are pushed here)."""
    return f"agent.{job_id}"


def publish_now(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(group, message)


def publish_after_commit(group: str, message: dict[str, Any], *, robust: bool = False) -> None:
    """``robust``: a channel-layer failure is logged, not raised into the committed caller
    (for publishers whose caller must not fail once its data is stored, e.g. ingest)."""
    transaction.on_commit(lambda: publish_now(group, message), robust=robust)
