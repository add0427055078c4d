"""A command as the agent protocol shows it: pushed when issued, returned until acknowledged,
and published when the job answers (docs/protocol.md "Commands")."""

from __future__ import annotations

from typing import Any

from breakers.models import Command


def command_payload(command: Command) -> dict[str, Any]:
    """The command as the agent protocol shows it (docs/protocol.md "Commands": id, kind, …)."""
    return {
        "id": command.pk,
        "kind": command.kind,
        "params": command.params,
        "severity": command.severity or None,
        "reason": command.reason,
        "issued_at": command.issued_at.isoformat().replace("+00:00", "Z"),
        "apply_at_step": command.apply_at_step,
    }
