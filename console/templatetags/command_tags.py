"""A command's kind in words, as the control plane names it (``CommandKind``'s labels): one
source for every page that shows a requested or issued command."""

from __future__ import annotations

from django import template

from breakers.models import CommandKind

register = template.Library()


@register.filter
def command_label(kind: str) -> str:
    """ "pause_data" → "Pause data loading"; an unknown kind is shown as it is."""
    try:
        return str(CommandKind(kind).label)
    except ValueError:
        return kind
