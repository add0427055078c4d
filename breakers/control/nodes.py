"""A node as people see it — healthy, drained by which alert, returned — and its return to
service by a manager (``scontrol update state=resume``), recorded on the drain's timeline.

Returning a node weighs as much as isolating one (it lets the scheduler place work on hardware
an alert called faulty), so it is authorised as ``isolate_node``: a manager or above.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from breakers.executors.slurm import executor as slurm
from breakers.executors.targets import node_binding
from breakers.models import NodeDrain, SchedulerBinding
from core.errors import Conflict
from core.transitions import compare_and_swap_all
from incidents.models import NODE_TRANSITIONS, Node, NodeStatus
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def visible_node(user: Any, node_id: int) -> Node:
    """The node if it belongs to a job of the user's teams, else NotFound (404)."""
    nodes = Node.objects.select_related("job")
    return scoped_get(nodes, user, node_id, team_path="job__team_id", noun="node")


def node_payload(node: Node) -> dict[str, Any]:
    """``state``: drained (by ``drain.alert``), returned (by ``drain.returned_by``), or the
    node's own status when Brakeline never drained it (healthy, failed, isolated)."""
    drains = NodeDrain.objects.filter(node=node).select_related("alert", "returned_by")
    drain = drains.order_by("-drained_at", "-pk").first()
    state = node.status if drain is None else "returned" if drain.returned_at else "drained"
    binding = SchedulerBinding.objects.filter(job_id=node.job_id).first()
    return {
        "id": node.pk,
        "hostname": node.hostname,
        "job": {"id": node.job_id, "name": node.job.name, "team_id": node.job.team_id},
        "status": node.status,
        "state": state,
        "drain": _drain_payload(drain) if drain is not None else None,
        "binding": node_binding(node.job_id, node.hostname),
        "scheduler": {
            "executor": binding.executor,
            "slurm_job_id": binding.slurm_job_id or None,
            "slurm_nodelist": binding.slurm_nodelist or None,
        }
        if binding is not None
        else None,
    }


def _drain_payload(drain: NodeDrain) -> dict[str, Any]:
    alert = drain.alert
    return {
        "id": drain.pk,
        "slurm_node": drain.slurm_node,
        "reason": drain.reason,
        "alert": {"id": alert.pk, "rule": alert.rule_name, "severity": alert.severity}
        if alert is not None
        else None,
        "incident_id": drain.incident_id,
        "command_id": drain.command_id,
        "drained_at": _iso(drain.drained_at),
        "requeued_at": _iso(drain.requeued_at),
        "returned_at": _iso(drain.returned_at),
        "returned_by": str(drain.returned_by) if drain.returned_by is not None else None,
    }


def return_node_to_service(
    node: Node | int, user: Any, *, reason: str = "", context: AuditContext | None = None
) -> NodeDrain:
    """A manager returns a drained node to service: ``state=resume`` in Slurm, then the record.

    404 outside the user's teams, 403 below manager, 409 when Brakeline has no open drain of the
    node, 502 (``SchedulerFailed``) when Slurm refuses — that failure is on the timeline too."""
    node_id = node.pk if isinstance(node, Node) else node
    with audited(user, Action.ISOLATE_NODE, "node", node_id, context) as attempt:
        nodes = Node.objects.select_related("job")
        node = scoped_get(
            nodes, user, node_id, team_path="job__team_id", noun="node", attempt=attempt
        )
        attempt.check(decide(role_in_team(user, node.job.team_id), Action.ISOLATE_NODE))
        with transaction.atomic():
            drains = NodeDrain.objects.select_for_update()
            drain = drains.filter(node=node, returned_at__isnull=True).first()
            if drain is None:
                raise Conflict(f"Node {node.hostname} is not drained by Brakeline.")
            # escalate=False: the person is right here and hears the failure (502).
            call_log = slurm.CallLog(
                drain.incident_id, alert_id=drain.alert_id, actor=user, escalate=False
            )
            call = slurm.resume_node(drain.slurm_node, call_log)
            if call.ok:
                _mark_returned(node, drain, user, reason, call_log)
                attempt.succeeded(f"node {drain.slurm_node} returned to service")
                return drain
        # Left the transaction normally, so the failed call's row is kept; then refuse.
        raise slurm.SchedulerFailed(
            f"Slurm refused to return {drain.slurm_node} to service: "
            f"{call.output or f'exit {call.returncode}'}",
        )


def _mark_returned(
    node: Node, drain: NodeDrain, user: Any, reason: str, call_log: slurm.CallLog
) -> None:
    drain.returned_at, drain.returned_by = timezone.now(), user
    drain.save(update_fields=["returned_at", "returned_by"])
    compare_and_swap_all(
        Node.objects.filter(pk=node.pk),
        table=NODE_TRANSITIONS,
        expected=[NodeStatus.ISOLATED, NodeStatus.FAILED],
        new=NodeStatus.HEALTHY,
    )
    why = f": {reason.strip()}" if reason.strip() else ""
    call_log.note(
        f"Node {drain.slurm_node} returned to service by {user}{why}",
        {"event": "node_returned", "node_id": node.pk, "drain_id": drain.pk, "reason": reason},
    )
