"""Celery tasks of the inference L3 response: thin and idempotent, by replica id."""

from __future__ import annotations

from celery import shared_task

from breakers.control.inference import recover_replica, reenable_if_healthy
from breakers.models import InferenceReplica


@shared_task(name="inference.recover_replica", acks_late=True, ignore_result=True)
def recover_replica_task(replica_id: int) -> None:
    """Drain, maintenance, restart. Only a replica still draining is acted on."""
    recover_replica(replica_id)


@shared_task(name="inference.reenable_replica", acks_late=True, ignore_result=True)
def reenable_replica_task(replica_id: int) -> None:
    """Back in traffic if the restarted process is healthy (a compare-and-swap: once)."""
    replica = InferenceReplica.objects.filter(pk=replica_id).first()
    if replica is not None:
        reenable_if_healthy(replica)
