"""A job's binding to its Slurm job (``SchedulerBinding``): made only once Slurm confirms it.

A heartbeat's Slurm context is an agent's word. ``bind_if_confirmed`` asks Slurm (in a worker,
``breakers.executors.slurm.tasks``) and binds only a job Slurm says is this one's; the executors
and the routed commands act through Slurm only on a job bound here (``slurm_binding``).
"""

from __future__ import annotations

import logging

from django.db import IntegrityError, transaction
from django.utils import timezone

from breakers.control.timeline import active_incident
from breakers.executors.slurm.executor import verify_slurm_job
from breakers.models import ExecutorKind, SchedulerBinding
from incidents.alerts.lifecycle import append_timeline
from incidents.models import TimelineKind

log = logging.getLogger(__name__)


def apply_context(job_id: int, reported: dict) -> None:
    context = {key: reported[key] for key in ("slurm_job_id", "slurm_nodelist", "slurm_step_id")}
    binding = SchedulerBinding.objects.filter(job_id=job_id).first()
    if binding is None:
        try:
            with transaction.atomic():
                SchedulerBinding.objects.create(
                    job_id=job_id,
                    executor=ExecutorKind.SLURM,
                    hostname=reported["hostname"],
                    rank=reported["rank"],
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
        changes.update(hostname=reported["hostname"], rank=reported["rank"])
    if not binding.executor_pinned and binding.executor != ExecutorKind.SLURM:
        changes["executor"] = ExecutorKind.SLURM
    if changes:
        SchedulerBinding.objects.filter(pk=job_id).update(**changes, updated_at=timezone.now())


def bind_if_confirmed(job_id: int, reported: dict) -> bool:
    """Bind the job to the reported Slurm job if Slurm says it is this job's and runs on the
    reported nodes (``breakers.executors.slurm.executor.verify_slurm_job``); else leave the
    binding as it was (a binding to a confirmed job stays) and say why."""
    slurm_job_id = reported["slurm_job_id"]
    verdict = verify_slurm_job(job_id, slurm_job_id, nodelist=reported["slurm_nodelist"])
    if verdict.ok:
        apply_context(job_id, reported)
        return True
    log.warning("Job %s not bound to Slurm job %s: %s", job_id, slurm_job_id, verdict.why)
    incident = active_incident(job_id)
    if incident is not None:
        append_timeline(
            incident.pk,
            TimelineKind.NOTE,
            f"Not bound to Slurm job {slurm_job_id} the agent reported: {verdict.why}",
            data={
                "event": "slurm_binding_refused",
                "slurm_job_id": slurm_job_id,
                **{"why": verdict.why},
            },
        )
    return False


def slurm_binding(job_id: int) -> SchedulerBinding | None:
    """The job's binding when the job is to be acted on through Slurm, else None."""
    return (
        SchedulerBinding.objects.filter(job_id=job_id, executor=ExecutorKind.SLURM)
        .exclude(slurm_job_id="")
        .first()
    )
