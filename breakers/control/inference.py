"""The inference profile's L3 response: out of traffic, restart, back in when healthy.

An inference replica holds no training state, so its L3 is aggressive and needs no
checkpoint. For a job of kind ``inference``, ``breakers.control.braking.brake_for_alert`` hands
any L3 to ``breakers.control.replica_response.take_replica_out`` instead of issuing
checkpoint_and_pause:

1. in the alert's transaction: the replica ``serving → draining`` (compare-and-swap, its
   timeline row), and the recovery queued after commit;
2. :func:`recover_replica` (Celery): the traffic executor drains the server (no new requests,
   those in flight finish), waits until none is in flight (bounded), puts it in maintenance,
   then restarts the process through the local executor (``draining → restarting``); when the
   local executor may not (another host), the replica's SDK is asked to restart itself;
3. :func:`reenable_if_healthy`, on each replica heartbeat: the first healthy heartbeat from the
   restarted process puts the server back (``ready``; ``restarting → serving``), resolves the
   alert and writes the time the replica spent out of traffic.

Every step is a timeline row of the alert's incident. The drained row is written once the
server is in maintenance, the back row is stamped just before ``ready`` is sent: between the
two rows' times the load balancer sent the replica no request. A failure on the way (HAProxy
unreachable, the restart refused and the SDK silent) leaves the replica ``failed`` and out of
traffic, with a row saying why: a person takes it from there.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from breakers.executors.restart import restart_replica
from breakers.executors.traffic import TrafficError, TrafficExecutor
from breakers.executors.traffic.job_traffic import traffic_executor
from breakers.models import InferenceReplica, ReplicaStatus
from breakers.models.inference import REPLICA_TRANSITIONS
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import append_timeline, resolve_alert
from incidents.models import TimelineKind

DRAIN_POLL_SECONDS = 0.05


def note_replica(
    replica: InferenceReplica,
    message: str,
    event: str,
    *,
    at: datetime | None = None,
    **data: object,
) -> None:
    if replica.incident_id is not None:
        append_timeline(
            replica.incident_id,
            TimelineKind.NOTE,
            message,
            at=at,
            alert_id=replica.response_alert_id,
            data={"event": event, "replica": replica.name, "backend": replica.backend, **data},
        )


def move_replica(replica: InferenceReplica, expected: str, new: str, **fields: Any) -> bool:
    won = compare_and_swap(
        InferenceReplica,
        replica.pk,
        table=REPLICA_TRANSITIONS,
        expected=[expected],
        new=new,
        **fields,
    )
    if won:
        replica.refresh_from_db()
    return won


def _fail(replica: InferenceReplica, expected: str, why: str) -> None:
    with transaction.atomic():
        if move_replica(replica, expected, ReplicaStatus.FAILED):
            note_replica(
                replica, f"Replica {replica.name} stays out of traffic: {why}", "replica_failed"
            )


def _drain(executor: TrafficExecutor, replica: InferenceReplica) -> float:
    """Drain, wait (bounded) until no request is in flight, then maintenance; the seconds."""
    started = time.monotonic()
    executor.drain(replica.backend, replica.name)
    deadline = started + settings.INFERENCE_DRAIN_SECONDS
    state = executor.state(replica.backend, replica.name)
    while state.sessions > 0 and time.monotonic() < deadline:
        time.sleep(DRAIN_POLL_SECONDS)
        state = executor.state(replica.backend, replica.name)
    executor.maintenance(replica.backend, replica.name)
    return time.monotonic() - started


def _claim(replica: InferenceReplica) -> bool:
    """One worker at a time drains and restarts a replica (a redelivered task, a second
    worker): a compare-and-swap on the claim, which expires after the longest the response
    can take, so a worker killed on the way does not leave the replica stuck for ever."""
    now = timezone.now()
    lease = settings.INFERENCE_DRAIN_SECONDS + settings.EXECUTOR_GRACE_SECONDS + 60.0
    expired = Q(recovery_claimed_at__isnull=True) | Q(
        recovery_claimed_at__lt=now - timedelta(seconds=lease)
    )
    claimed = InferenceReplica.objects.filter(
        expired, pk=replica.pk, status=ReplicaStatus.DRAINING
    ).update(recovery_claimed_at=now)
    return claimed == 1


def recover_replica(replica_id: int) -> None:
    """Steps 2 of the response (idempotent: only a replica still ``draining`` is acted on)."""
    replica = InferenceReplica.objects.filter(pk=replica_id).first()
    if replica is None or replica.status != ReplicaStatus.DRAINING or not _claim(replica):
        return
    executor = traffic_executor(replica.job_id)
    if executor is None:
        _fail(
            replica,
            ReplicaStatus.DRAINING,
            "no traffic executor is configured (BRAKELINE_HAPROXY_SOCKET): it could not be drained",
        )
        return
    try:
        seconds = _drain(executor, replica)
    except TrafficError as error:
        _fail(replica, ReplicaStatus.DRAINING, str(error))
        return
    with transaction.atomic():
        note_replica(
            replica,
            f"Drained in {executor.name} ({replica.backend}/{replica.name}): no "
            f"request in flight after {seconds:.2f} s; in maintenance",
            "replica_drained",
            seconds=round(seconds, 3),
        )
    _restart(replica)


def _restart(replica: InferenceReplica) -> None:
    """Step 2's second half: the drained replica restarted here, or asked to restart itself."""
    outcome = restart_replica(replica, grace_seconds=settings.EXECUTOR_GRACE_SECONDS)
    with transaction.atomic():
        if outcome.stopped:
            move_replica(
                replica,
                ReplicaStatus.DRAINING,
                ReplicaStatus.RESTARTING,
                restarts=replica.restarts + 1,
            )
            note_replica(
                replica,
                "Restarted by the local executor: " + "; ".join(outcome.steps),
                "replica_restarted",
                new_pid=int(outcome.detail),
            )
            return
        # Another host, or a pid not proven the replica's: the replica's SDK restarts itself.
        move_replica(
            replica,
            ReplicaStatus.DRAINING,
            ReplicaStatus.RESTARTING,
            pending_action="restart",
            restarts=replica.restarts + 1,
        )
        note_replica(
            replica,
            f"Local restart {outcome.detail}; the replica is asked to restart itself",
            "replica_restart_requested",
        )


def _back_to_serving(
    replica: InferenceReplica, now: datetime, seconds: float, in_traffic: bool
) -> bool:
    """RESTARTING → SERVING and its note, in one transaction; False when another worker
    moved it first."""
    with transaction.atomic():
        if not move_replica(
            replica,
            ReplicaStatus.RESTARTING,
            ReplicaStatus.SERVING,
            out_of_traffic_since=None,
            pending_action="",
        ):
            return False
        note_replica(
            replica,
            f"Back in traffic ({replica.backend}/{replica.name} ready, "
            f"{'confirmed' if in_traffic else 'not yet confirmed'} by the load balancer) as "
            f"process {replica.pid}, after {seconds:.1f} s out of traffic",
            "replica_back",
            at=now,
            seconds_out_of_traffic=round(seconds, 3),
        )
    return True


def reenable_if_healthy(replica: InferenceReplica, now: datetime | None = None) -> bool:
    """Step 3, after a heartbeat: back in traffic once the restarted process is healthy.
    True when this call put it back. ``now``: when it went back (by default the moment just
    before ``ready`` is sent: from then on the load balancer may send it requests, so a
    request it answers is never one answered while it was out)."""
    restarted = replica.pid is not None and replica.pid != replica.pid_before_restart
    if replica.status != ReplicaStatus.RESTARTING or not (replica.healthy and restarted):
        return False
    executor = traffic_executor(replica.job_id)
    now = now or timezone.now()
    try:
        if executor is None:
            raise TrafficError("no traffic executor is configured")
        executor.ready(replica.backend, replica.name)
        in_traffic = executor.state(replica.backend, replica.name).in_traffic
    except TrafficError as error:
        _fail(replica, ReplicaStatus.RESTARTING, f"could not be put back: {error}")
        return False
    out_since = replica.out_of_traffic_since
    seconds = (now - out_since).total_seconds() if out_since else 0.0
    alert_id = replica.response_alert_id
    if not _back_to_serving(replica, now, seconds, in_traffic):
        return False
    if alert_id is not None:
        resolve_alert(alert_id, reason=f"replica {replica.name} restarted and healthy again")
    return True
