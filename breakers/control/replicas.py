"""Replica heartbeats of inference jobs: ``POST /api/v1/agent/replicas/heartbeat``.

Body: ``{"replica": "r1", "backend": "models", "pid": 1234, "hostname": "gpu-1",
"healthy": true, "detail": "", "draining": false}``. The replica's health is what its health
hook says (the SDK's ``brakeline.inference.Replica``); an unhealthy heartbeat from a replica in
traffic raises the job's L3 "inference replica unhealthy" for that replica (node = replica),
and the inference L3 response takes it from there (``breakers.control.inference``). The reply
carries what the replica must do itself (``{"commands": [{"action": "restart"}]}``) when the
console cannot act from outside.

The replica and backend must be a server a team admin declared for the job
(``InferenceServer``): any other name is a 400 naming ``replica``.

Strict like every agent input: unknown fields, wrong types and bad names are a 400 naming
the field, and nothing is written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from breakers.agent.protocol import is_whole_number, load_json
from breakers.control.braking import brake_for_alert
from breakers.executors.targets import traffic_server
from breakers.executors.traffic.tasks import reenable_replica_task
from breakers.models import InferenceReplica, ReplicaStatus
from core.errors import InvalidInput
from core.processes import process_start_time, this_host
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.models import Job, JobKind
from incidents.notifications.rounds import notify_alert

UNHEALTHY_RULE_KEY = "inference-replica-unhealthy"
_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,100}$")
FIELDS = {"replica", "backend", "pid", "hostname", "healthy", "detail", "draining"}


@dataclass(frozen=True)
class ReplicaHeartbeat:
    replica: str
    backend: str
    pid: int | None
    hostname: str
    healthy: bool
    detail: str
    draining: bool


def parse_replica_heartbeat(raw: bytes) -> ReplicaHeartbeat:
    body = load_json(raw, strict_constants=True)
    if not isinstance(body, dict):
        raise InvalidInput("The body must be a JSON object.", code="malformed_json")
    errors: dict[str, str] = {}
    for key in body.keys() - FIELDS:
        errors[str(key)[:100]] = "is not a field of a replica heartbeat"
    for key in ("replica", "backend"):
        value = body.get(key)
        if not isinstance(value, str) or not _NAME.match(value):
            errors[key] = "is required: 1-100 letters, digits, '_', '.', ':' or '-'"
    pid = body.get("pid")
    if pid is not None and not (is_whole_number(pid) and 1 < pid < 2**31):
        errors["pid"] = "must be a process id (a whole number > 1)"
    for key, kind, limit in (("hostname", str, 255), ("detail", str, 500)):
        value = body.get(key, "")
        if not isinstance(value, kind) or len(value) > limit:
            errors[key] = f"must be a string of at most {limit} characters"
    for key in ("healthy", "draining"):
        if key in body and not isinstance(body[key], bool):
            errors[key] = "must be true or false"
    if "healthy" not in body:
        errors["healthy"] = "is required: true or false"
    if errors:
        raise InvalidInput("The replica heartbeat was refused.", fields=errors)
    return ReplicaHeartbeat(
        body["replica"],
        body["backend"],
        pid,
        body.get("hostname", ""),
        body["healthy"],
        body.get("detail", ""),
        body.get("draining", False),
    )


def _register(job: Job, beat: ReplicaHeartbeat) -> InferenceReplica:
    replica, _ = InferenceReplica.objects.select_for_update().get_or_create(
        job=job, name=beat.replica, defaults={"backend": beat.backend}
    )
    if beat.pid != replica.pid or beat.hostname != replica.hostname:
        # A new process: its start time is read now, from /proc, when it runs on this host.
        replica.pid_start_time = (
            process_start_time(beat.pid) if beat.pid and beat.hostname == this_host() else None
        )
    replica.backend, replica.pid, replica.hostname = beat.backend, beat.pid, beat.hostname
    replica.healthy, replica.health_detail = beat.healthy, beat.detail
    replica.last_heartbeat_at = timezone.now()
    if replica.pending_action == "restart" and beat.pid != replica.pid_before_restart:
        replica.pending_action = ""  # done: another process heartbeats
    replica.save()
    return replica


def _unhealthy_signal(replica: InferenceReplica) -> AlertSignal:
    now = timezone.now()
    detail = replica.health_detail or "its health hook says unhealthy"
    return AlertSignal(
        rule_key=UNHEALTHY_RULE_KEY,
        rule_name="Inference replica unhealthy",
        layer="health",
        severity="L3",
        metric="replica.health",
        node=replica.name,
        value=0.0,
        threshold=None,
        description=f"replica {replica.backend}/{replica.name} unhealthy: {detail}"[:900],
        step=0,
        time=now,
        first_step=0,
        first_time=now,
        action="checkpoint_and_pause",  # an inference job's L3: out of traffic and restart
        runbook_hint="non_finite" if "nan" in detail.lower() else "",
    )


def record_replica_heartbeat(job: Job, raw: bytes) -> dict[str, Any]:
    """Store the heartbeat; raise the replica's L3 when it turned unhealthy in traffic; put it
    back in traffic when it is the healthy restarted process. The reply's commands."""
    beat = parse_replica_heartbeat(raw)
    if job.kind != JobKind.INFERENCE:
        raise InvalidInput(
            f"Job {job.name!r} is a {job.kind} job; replica heartbeats are for inference jobs.",
            fields={"replica": "only inference jobs have replicas"},
        )
    why = traffic_server(job.pk, beat.backend, beat.replica)
    if why is not None:
        # The agent reports its replica; it never designates a server: a team admin declares
        # the job's servers (PUT /api/v1/jobs/{id}/inference-servers).
        raise InvalidInput(f"Replica refused: {why}.", fields={"replica": why})
    with transaction.atomic():
        replica = _register(job, beat)
        if not beat.healthy and replica.status == ReplicaStatus.SERVING:
            outcome = raise_or_update_alert(job.pk, _unhealthy_signal(replica))
            if outcome.action_due:
                brake_for_alert(outcome.alert)
                notify_alert(outcome.alert.pk)
    replica.refresh_from_db()
    if replica.status == ReplicaStatus.RESTARTING and beat.healthy:
        reenable_replica_task.delay(replica.pk)
    commands = [{"action": replica.pending_action}] if replica.pending_action else []
    return {"replica": replica.name, "status": replica.status, "commands": commands}
