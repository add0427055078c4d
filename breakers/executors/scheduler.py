"""Which scheduler a job runs under, learnt from its heartbeats, and what is routed there.

A heartbeat that carries a ``slurm_job_id`` binds the job to Slurm (``SchedulerBinding``): from
then on a hung job is stopped with ``scancel`` rather than a local signal, and the commands a job
cannot carry out alone — draining a faulty node, cancelling on L4 — are also carried out through
the scheduler, by a Celery task after the command commits (``breakers.executors.slurm.tasks``).
"""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from breakers.agent.protocol import HeartbeatIn
from breakers.models import Command, CommandKind, ExecutorKind, SchedulerBinding


def record_scheduler_context(job_id: int, heartbeat: HeartbeatIn) -> None:
    """Store the job's Slurm context when it changed (a write per new context, not per beat)."""
    if not heartbeat.slurm_job_id:
        # The job runs outside Slurm now: an automatic Slurm binding no longer applies.
        SchedulerBinding.objects.filter(
            job_id=job_id, executor=ExecutorKind.SLURM, executor_pinned=False
        ).update(executor=ExecutorKind.LOCAL, updated_at=timezone.now())
        return
    context = {
        "slurm_job_id": heartbeat.slurm_job_id,
        "slurm_nodelist": heartbeat.slurm_nodelist,
        "slurm_step_id": heartbeat.slurm_step_id,
    }
    binding = SchedulerBinding.objects.filter(job_id=job_id).first()
    if binding is None:
        try:
            with transaction.atomic():
                SchedulerBinding.objects.create(
                    job_id=job_id,
                    executor=ExecutorKind.SLURM,
                    hostname=heartbeat.hostname,
                    rank=heartbeat.rank,
                    **context,
                )
            return
        except IntegrityError:  # another rank's heartbeat created it first
            binding = SchedulerBinding.objects.get(job_id=job_id)
    changes: dict[str, object] = {
        key: value for key, value in context.items() if getattr(binding, key) != value
    }
    if changes:
        # Ranks of one job differ only in host and rank: those follow a new context, never
        # flip-flop between ranks on every heartbeat.
        changes.update(hostname=heartbeat.hostname, rank=heartbeat.rank)
    if not binding.executor_pinned and binding.executor != ExecutorKind.SLURM:
        changes["executor"] = ExecutorKind.SLURM
    if changes:
        SchedulerBinding.objects.filter(pk=job_id).update(**changes, updated_at=timezone.now())


def executor_name(job_id: int) -> str:
    """The name of the job's executor in ``breakers.executors.local.EXECUTORS``."""
    name = SchedulerBinding.objects.filter(job_id=job_id).values_list("executor", flat=True)
    return name.first() or ExecutorKind.LOCAL


def slurm_binding(job_id: int) -> SchedulerBinding | None:
    """The job's binding when the job is to be acted on through Slurm, else None."""
    return (
        SchedulerBinding.objects.filter(job_id=job_id, executor=ExecutorKind.SLURM)
        .exclude(slurm_job_id="")
        .first()
    )


def goes_to_scheduler(command: Command) -> bool:
    """Commands the job cannot carry out alone: draining a node always (a process cannot drain
    its own node), terminating at L4 (no cooperation is waited for at L4)."""
    if command.kind == CommandKind.ISOLATE_NODE:
        return bool(command.params.get("node"))
    return command.kind == CommandKind.TERMINATE and command.severity == "L4"


def route_to_scheduler(command: Command) -> None:
    """Call inside the command's transaction: after commit, a task acts through Slurm too."""
    if not goes_to_scheduler(command) or slurm_binding(command.job_id) is None:
        return
    from breakers.executors.slurm.tasks import (
        act_through_slurm,  # the task module imports the control plane
    )

    command_id = command.pk
    # robust: the command is stored and on its way to the job; a broker hiccup must not undo
    # that. A lost task leaves the command to the job and the executor fallback on expiry.
    transaction.on_commit(lambda: act_through_slurm.delay(command_id), robust=True)
