"""Celery tasks of the Slurm executor: thin, by id, idempotent (see
breakers.executors.slurm.actions)."""

from __future__ import annotations

from celery import shared_task

from breakers.executors.slurm.actions import act_on_command
from breakers.executors.slurm.binding import bind_if_confirmed


@shared_task(name="slurm.act_through_slurm", acks_late=True, ignore_result=True)
def act_through_slurm(command_id: int) -> None:
    """A routed command (L4 terminate, isolate_node) of a Slurm-bound job, through Slurm."""
    act_on_command(command_id)


@shared_task(name="slurm.confirm_slurm_binding", acks_late=True, ignore_result=True)
def confirm_slurm_binding(job_id: int, reported: dict) -> None:
    """A heartbeat reported a new Slurm context: bind the job if Slurm confirms it."""
    bind_if_confirmed(job_id, reported)
