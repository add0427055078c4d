"""A button of the console's pages: what the browser sends when it is pressed (the server
decides which buttons a person sees: ``console.board``, ``console.incident_board``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Button:
    label: str
    url: str
    style: str = "plain"  # primary | danger | plain
    body: dict[str, Any] = field(default_factory=dict)  # sent as is, with the asked fields
    ask: list[dict[str, Any]] = field(default_factory=list)  # fields the dialog asks for
    title: str = ""  # the dialog's heading
    now: bool = False  # one click: sent at once, no dialog (nothing to ask)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
