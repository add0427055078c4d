"""The start of an inference replica's L3 response: out of traffic now, recovered by a worker.

``breakers.control.braking.brake_for_alert`` hands an inference job's L3 here instead of
issuing checkpoint_and_pause; the recovery that follows is ``breakers.control.inference``.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from breakers.control.inference import move_replica, note_replica
from breakers.executors.traffic.tasks import recover_replica_task
from breakers.models import CommandKind, InferenceReplica, ReplicaStatus
from incidents.alerts.lifecycle import append_timeline
from incidents.models import Alert, TimelineKind
from incidents.teams.authority import SYSTEM, action_for_command, decide


def _note_refused(alert: Alert, why: str) -> None:
    """Why the replica stays in traffic, on the incident's timeline (if the alert has one)."""
    if alert.incident_id is not None:
        append_timeline(
            alert.incident_id,
            TimelineKind.NOTE,
            f"No automatic replica restart: {why}",
            alert_id=alert.pk,
            data={"event": "replica_response_refused"},
        )


def take_replica_out(alert: Alert) -> list:
    """The L3 of an inference job (inside the alert's transaction). Returns no command: the
    response is the replica's, not the job's."""
    # Judged as the pause it stands in for: what the system may do at the alert's level.
    decision = decide(SYSTEM, action_for_command(CommandKind.CHECKPOINT_AND_PAUSE), alert.severity)
    replica = InferenceReplica.objects.filter(job_id=alert.job_id, name=alert.node).first()
    why = None if decision.allowed else decision.reason
    if why is None and replica is None:
        why = f"no replica named {alert.node!r} heartbeats for this job"
    if why is not None:
        _note_refused(alert, why)
        return []
    assert replica is not None
    now = timezone.now()
    moved = move_replica(
        replica,
        ReplicaStatus.SERVING,
        ReplicaStatus.DRAINING,
        out_of_traffic_since=now,
        response_alert_id=alert.pk,
        incident_id=alert.incident_id,
        pid_before_restart=replica.pid,
        recovery_claimed_at=None,
    )
    if not moved:
        return []  # already out of traffic: one response at a time
    note_replica(
        replica,
        f"Inference L3: replica {replica.backend}/{replica.name} leaves traffic, "
        "restarts and comes back when healthy (no checkpoint)",
        "replica_response_started",
    )
    replica_id = replica.pk
    transaction.on_commit(lambda: recover_replica_task.delay(replica_id))
    return []
