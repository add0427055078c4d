"""Automatic braking: what the system does, at once, when a rule's alert is raised.

L2 → the rule's soft mitigation (lower the learning rate, pause data loading); L3 →
checkpoint_and_pause; L4 → terminate plus isolate_node for each failing node. No person is
waited for. Each command's idempotency key names the alert, its severity and the command, so
a redelivered evaluation or a second worker issues nothing twice.
"""

from __future__ import annotations

from breakers.control.commands import issue_command
from breakers.models import Command, CommandKind
from incidents.models import Alert

# A rule's action → the commands that carry it out.
ACTION_COMMANDS: dict[str, tuple[str, ...]] = {
    "lower_lr": (CommandKind.LOWER_LR,),
    "pause_data": (CommandKind.PAUSE_DATA,),
    "checkpoint_and_pause": (CommandKind.CHECKPOINT_AND_PAUSE,),
    "terminate_and_isolate": (CommandKind.TERMINATE, CommandKind.ISOLATE_NODE),
}


def _failing_nodes(alert: Alert) -> list[str]:
    nodes = [node for node in (alert.nodes or []) if node]
    return nodes or ([alert.node] if alert.node else [])


def _reason(alert: Alert) -> str:
    where = f" on {alert.node}" if alert.node else ""
    return f"{alert.severity} {alert.rule_name}{where} at step {alert.step}: {alert.description}"


def brake_for_alert(alert: Alert) -> list[Command]:
    """Issue the commands the alert's rule asks for, as the system; once per alert and level."""
    commands = []
    for kind in ACTION_COMMANDS.get(alert.action, ()):
        targets = _failing_nodes(alert) if kind == CommandKind.ISOLATE_NODE else [None]
        for node in targets:
            params = dict(alert.action_params) if kind == CommandKind.LOWER_LR else {}
            if node is not None:
                params["node"] = node
            key = f"alert:{alert.pk}:{alert.severity}:{kind}" + (f":{node}" if node else "")
            issued = issue_command(
                alert.job_id,
                kind,
                reason=_reason(alert),
                params=params,
                severity=alert.severity,
                idempotency_key=key,
                alert_id=alert.pk,
            )
            commands.append(issued.command)
    return commands
