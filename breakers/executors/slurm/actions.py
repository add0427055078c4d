"""Commands of Slurm-bound jobs carried out through Slurm: L4 cancel, node drain, requeue.

Run by ``slurm.act_through_slurm`` after the command committed. Idempotent, so a
redelivered task does nothing twice: an ended job is not cancelled again, a drain already
recorded for the command is not repeated, a requeue happens once per drain. When Slurm has done
what the command asked, the command is acknowledged on the job's behalf (the job may be killed
by it, or cannot drain its own node) — a no-op when the job answered first.
"""

from __future__ import annotations

import re

from django.db import IntegrityError, transaction
from django.utils import timezone

from breakers.control.acknowledge import acknowledge_command
from breakers.executors.slurm import executor as slurm
from breakers.executors.slurm.binding import slurm_binding
from breakers.executors.slurm.client import job_nodes
from breakers.executors.targets import register
from breakers.models import (
    OPEN_COMMAND_STATUSES,
    Command,
    CommandKind,
    CommandStatus,
    NodeDrain,
    SchedulerBinding,
)
from core.nodes import is_single_node_name
from core.transitions import compare_and_swap_all
from incidents.models import (
    FINAL_JOB_STATUSES,
    ISOLATABLE_NODE_STATUSES,
    NODE_TRANSITIONS,
    Job,
    Node,
    NodeStatus,
    TimelineKind,
)

MAX_REASON_LENGTH = 200
register(
    "slurm-drain",
    __name__,
    acts_on="a node Slurm lists for the job's confirmed Slurm job (drain, requeue, cancel)",
    check="slurm.node_of_the_job",
)


def act_on_command(command_id: int) -> None:
    """Carry out a routed command through Slurm (see
    ``breakers.executors.scheduler.goes_to_scheduler``)."""
    command = Command.objects.select_related("alert").get(pk=command_id)
    binding = slurm_binding(command.job_id)
    if binding is None:
        return  # the job left Slurm meanwhile: the command stays the job's business
    if command.kind == CommandKind.TERMINATE:
        cancel_job(command, binding)
    elif command.kind == CommandKind.ISOLATE_NODE:
        drain_node(command, binding)


def _call_log(command: Command) -> slurm.CallLog:
    return slurm.CallLog.for_job(command.job_id, command_id=command.pk, alert_id=command.alert_id)


def _acknowledge(command: Command, call_log: slurm.CallLog, **result: object) -> None:
    acknowledge_command(
        command.job_id,
        command.pk,
        status=CommandStatus.SUCCEEDED,
        result={
            "by": "slurm",
            **result,
            "calls": [call.command_line for call in call_log.calls],
        },
    )


def cancel_job(command: Command, binding: SchedulerBinding) -> str:
    """L4 terminate: ``scancel``, wait until Slurm says the job ended; its final state."""
    call_log = _call_log(command)
    verdict = slurm.verified_job(call_log, command.job_id, binding.slurm_job_id, "cancel the job")
    if not verdict.ok:
        return slurm.UNKNOWN  # refused (or Slurm unreachable): on the timeline, nothing cancelled
    state = slurm.cancel(binding.slurm_job_id, call_log)
    if state in slurm.ENDED_STATES:
        _acknowledge(command, call_log, slurm_job_id=binding.slurm_job_id, state=state)
    return state


def drain_reason(command: Command) -> str:
    """``brakeline: <alert>`` — what ``sinfo -R`` shows the cluster's administrators."""
    alert = command.alert
    what = f"{alert.rule_name} (alert {alert.pk})" if alert is not None else command.reason
    return re.sub(r"\s+", " ", f"brakeline: {what}")[:MAX_REASON_LENGTH]


def drain_node(command: Command, binding: SchedulerBinding) -> NodeDrain | None:
    """Drain the command's node in Slurm, record the drain, requeue if the job asks for it."""
    name = command.params["node"]
    done = NodeDrain.objects.filter(command=command).first()
    if done is not None:
        return done  # a redelivered task: drained (and maybe requeued) already
    call_log = _call_log(command)
    if not _node_of_the_job(command, binding, name, call_log):
        return None
    reason = drain_reason(command)
    if not slurm.drain(name, reason, call_log):
        return None  # recorded, raised and notified by the call log
    with transaction.atomic():
        drain = _record_drain(command, name, reason, call_log)
    _acknowledge(command, call_log, node=name, reason=reason)
    if binding.requeue_after_drain and _may_requeue(command):
        requeue_job(drain, binding, call_log)
    return drain


def _node_of_the_job(
    command: Command, binding: SchedulerBinding, name: str, call_log: slurm.CallLog
) -> bool:
    """Drain only one node, and only one the Slurm job runs on (as Slurm says right now): an
    agent's word (a point's ``node``) never aims a drain at another job's or team's node."""
    purpose = f"drain node {name}"
    if not is_single_node_name(name):
        slurm.refused(call_log, purpose, f"{name!r} is not one node's name (a host list?)")
        return False
    verdict = slurm.verified_job(call_log, command.job_id, binding.slurm_job_id, purpose)
    if not verdict.ok or verdict.slurm_job is None:
        return False
    nodes, call = job_nodes(verdict.slurm_job.nodelist)
    if call is not None:
        call_log.record(call, f"list the nodes of Slurm job {binding.slurm_job_id}")
    if nodes is None:
        return False
    if name not in nodes:
        slurm.refused(
            call_log,
            purpose,
            f"{name} is not a node of Slurm job {binding.slurm_job_id} "
            f"({verdict.slurm_job.nodelist or 'it runs on no node'})",
        )
        return False
    return True


def _record_drain(command: Command, name: str, reason: str, call_log: slurm.CallLog) -> NodeDrain:
    node, _ = Node.objects.get_or_create(job_id=command.job_id, hostname=name)
    compare_and_swap_all(
        Node.objects.filter(pk=node.pk),
        table=NODE_TRANSITIONS,
        expected=ISOLATABLE_NODE_STATUSES,
        new=NodeStatus.ISOLATED,
    )
    try:
        with transaction.atomic():
            drain = NodeDrain.objects.create(
                node=node,
                slurm_node=name,
                reason=reason,
                alert_id=command.alert_id,
                incident_id=call_log.incident_id,
                command=command,
                drained_at=timezone.now(),
            )
    except IntegrityError:
        # Drained by an earlier alert and not returned yet: that drain stands for both.
        drain = NodeDrain.objects.get(node=node, returned_at__isnull=True)
    call_log.note(
        f"Node {name} drained in Slurm: the scheduler places nothing there until a manager "
        "returns it to service",
        {"event": "node_drained", "node": name, "node_id": node.pk, "drain_id": drain.pk},
    )
    return drain


def _may_requeue(command: Command) -> bool:
    """Not when the job is being terminated (an L4 terminates: requeueing would restart a job
    the console no longer watches)."""
    job = Job.objects.get(pk=command.job_id)
    terminating = Command.objects.filter(
        job_id=command.job_id, kind=CommandKind.TERMINATE, status__in=OPEN_COMMAND_STATUSES
    ).exists()
    return job.status not in FINAL_JOB_STATUSES and not terminating


def requeue_job(drain: NodeDrain, binding: SchedulerBinding, call_log: slurm.CallLog) -> bool:
    """``scontrol requeue``: Slurm kills the job and restarts it, away from the drained node;
    the job resumes from its last checkpoint."""
    claimed = NodeDrain.objects.filter(pk=drain.pk, requeued_at__isnull=True).update(
        requeued_at=timezone.now()
    )
    if not claimed:
        return False  # requeued once already
    if not slurm.requeue(binding.slurm_job_id, call_log):
        NodeDrain.objects.filter(pk=drain.pk).update(requeued_at=None)
        return False
    call_log.note(
        f"Slurm job {binding.slurm_job_id} requeued after the drain of {drain.slurm_node}: it "
        "restarts from its last checkpoint",
        {"event": "job_requeued", "slurm_job_id": binding.slurm_job_id, "drain_id": drain.pk},
        kind=TimelineKind.NOTE,
    )
    return True
