"""Which scheduler a job runs under, learnt from its heartbeats, and what is routed there.

A heartbeat that carries a ``slurm_job_id`` binds the job to Slurm (``SchedulerBinding``) once
Slurm confirms that job is this one's (``breakers.executors.slurm.binding``, in a worker: it
exists, its comment or name carries the Brakeline job id, it runs on the reported nodes): from
then on a hung job is stopped with ``scancel`` rather than a local signal, and the commands a
job cannot carry out alone — draining a faulty node, cancelling on L4 — are also carried out
through the scheduler, by a Celery task after the command commits
(``breakers.executors.slurm.tasks``).
"""

from __future__ import annotations

import hashlib

from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from breakers.agent.protocol import HeartbeatIn
from breakers.executors.local import LocalProcessExecutor
from breakers.executors.outcome import Executor
from breakers.executors.slurm.binding import apply_context, slurm_binding
from breakers.executors.slurm.executor import SlurmExecutor
from breakers.executors.slurm.tasks import act_through_slurm, confirm_slurm_binding
from breakers.models import Command, CommandKind, ExecutorKind, SchedulerBinding
from incidents.models import Job

_UNBIND_SQL = (
    f"UPDATE {SchedulerBinding._meta.db_table} SET executor = %s, updated_at = %s "
    "WHERE job_id = %s AND executor = %s AND executor_pinned = %s"
)


def _unbind_outside_slurm(job_id: int) -> None:
    """The job runs outside Slurm now: an automatic Slurm binding no longer applies."""
    # Plain SQL (both databases): every heartbeat outside Slurm runs it, and it changes
    # nothing almost always, so the ORM's building of it was most of its cost.
    with connection.cursor() as cursor:
        cursor.execute(
            _UNBIND_SQL,
            [
                ExecutorKind.LOCAL.value,
                connection.ops.adapt_datetimefield_value(timezone.now()),
                job_id,
                ExecutorKind.SLURM.value,
                False,
            ],
        )


def record_scheduler_context(job_id: int, heartbeat: HeartbeatIn) -> None:
    """Store the job's Slurm context when it changed (a write per new context, not per beat).

    A context the binding already holds (confirmed when it was bound) applies at once. A new
    one is the agent's word only: it is handed to a worker, which asks Slurm
    (``bind_if_confirmed``) and binds the job only if Slurm confirms it; the web process needs
    no Slurm client, and a heartbeat never waits for Slurm."""
    if not heartbeat.slurm_job_id:
        _unbind_outside_slurm(job_id)
        return
    reported = {
        "slurm_job_id": heartbeat.slurm_job_id,
        "slurm_nodelist": heartbeat.slurm_nodelist,
        "slurm_step_id": heartbeat.slurm_step_id,
        "hostname": heartbeat.hostname,
        "rank": heartbeat.rank,
    }
    binding = SchedulerBinding.objects.filter(job_id=job_id).first()
    known = binding is not None and (binding.slurm_job_id, binding.slurm_nodelist) == (
        heartbeat.slurm_job_id,
        heartbeat.slurm_nodelist,
    )
    if known:
        apply_context(job_id, reported)
        return
    if not _claim_check(job_id, reported):
        return  # checked (or being checked) lately, or too many checks of this job lately
    # robust: the heartbeat is stored; a broker hiccup only delays the binding (next context).
    transaction.on_commit(lambda: confirm_slurm_binding.delay(job_id, reported), robust=True)


CHECK_MEMORY_SECONDS = 60
MAX_CHECKS_PER_MINUTE = 5  # Slurm checks of new contexts, per job


def _job_key(job_id: int) -> str:
    # With the job's creation time: a job id reused (another database) starts afresh.
    created = Job.objects.filter(pk=job_id).values_list("created_at", flat=True).first()
    return f"{job_id}:{created.timestamp() if created else ''}"


def _claim_check(job_id: int, reported: dict) -> bool:
    """One Slurm check per new context a minute, and at most five a minute per job, so an agent
    repeating (or varying) a foreign Slurm job id costs no Slurm call per heartbeat."""
    job_key = _job_key(job_id)
    context = f"{reported['slurm_job_id']}|{reported['slurm_nodelist']}".encode()
    key = f"brakeline:slurm-check:{job_key}:{hashlib.sha256(context).hexdigest()}"
    budget = f"brakeline:slurm-checks:{job_key}"
    if (cache.get(budget) or 0) >= MAX_CHECKS_PER_MINUTE:
        return False
    if not cache.add(key, 1, CHECK_MEMORY_SECONDS):
        return False
    cache.add(budget, 0, CHECK_MEMORY_SECONDS)
    try:
        cache.incr(budget)
    except ValueError:  # expired in between
        cache.set(budget, 1, CHECK_MEMORY_SECONDS)
    return True


# The executors by the name a scheduler binding gives (``SchedulerBinding.executor``).
EXECUTORS: dict[str, Executor] = {
    ExecutorKind.LOCAL.value: LocalProcessExecutor(),
    ExecutorKind.SLURM.value: SlurmExecutor(),
}


def executor_name(job_id: int) -> str:
    """The name of the job's executor in ``EXECUTORS``."""
    name = SchedulerBinding.objects.filter(job_id=job_id).values_list("executor", flat=True)
    return name.first() or ExecutorKind.LOCAL


def executor_for(job: Job) -> Executor:
    """The executor the job's scheduler binding names; local by default."""
    return EXECUTORS.get(executor_name(job.pk), EXECUTORS[ExecutorKind.LOCAL.value])


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
    command_id = command.pk
    # robust: the command is stored and on its way to the job; a broker hiccup must not undo
    # that. A lost task leaves the command to the job and the executor fallback on expiry.
    transaction.on_commit(lambda: act_through_slurm.delay(command_id), robust=True)
