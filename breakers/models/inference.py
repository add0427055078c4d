"""Replicas of inference jobs: what the traffic executor and the L3 response act on.

An inference job (``Job.kind == "inference"``) is served by replicas, each a process behind a
load balancer. Each replica heartbeats on its own (``POST /api/v1/agent/replicas/heartbeat``)
with its name (the load balancer's server name), its backend, its process and its health as
its health hook judges it. The L3 response of an inference job is aggressive because a replica
holds no state: out of traffic, restart, back in when healthy (``breakers.control.inference``).
"""

from __future__ import annotations

from django.db import models

from incidents.models import Incident, Job

__all__ = ["REPLICA_TRANSITIONS", "InferenceReplica", "ReplicaStatus"]


class ReplicaStatus(models.TextChoices):
    SERVING = "serving", "Serving"  # in traffic
    DRAINING = "draining", "Draining"  # the L3 response took it out; sessions finishing
    RESTARTING = "restarting", "Restarting"  # out of traffic, restarted, awaiting health
    FAILED = "failed", "Failed"  # the response could not finish: a person must look


REPLICA_TRANSITIONS: dict[str, set[str]] = {
    ReplicaStatus.SERVING: {ReplicaStatus.DRAINING},
    ReplicaStatus.DRAINING: {ReplicaStatus.RESTARTING, ReplicaStatus.FAILED},
    ReplicaStatus.RESTARTING: {ReplicaStatus.SERVING, ReplicaStatus.FAILED},
    # A person restarted it by hand, or it came back healthy: the next healthy heartbeat
    # puts it back; or another L3 takes it out again.
    ReplicaStatus.FAILED: {ReplicaStatus.SERVING, ReplicaStatus.DRAINING},
}
OUT_OF_TRAFFIC = (ReplicaStatus.DRAINING, ReplicaStatus.RESTARTING, ReplicaStatus.FAILED)


class InferenceReplica(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="replicas")
    name = models.CharField(max_length=100, help_text="The load balancer's server name.")
    backend = models.CharField(max_length=100, help_text="The load balancer's backend.")
    status = models.CharField(
        max_length=16, choices=ReplicaStatus.choices, default=ReplicaStatus.SERVING
    )
    hostname = models.CharField(max_length=255, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    # Read from /proc when the pid was first reported from this host: the local executor
    # restarts the process only while the pid still has this start time (pid reuse).
    pid_start_time = models.BigIntegerField(null=True, blank=True)
    healthy = models.BooleanField(default=True)
    health_detail = models.CharField(max_length=500, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The L3 response in progress: when the replica left traffic, for which alert/incident,
    # and the pid it had then (a heartbeat from another pid is the restarted process).
    out_of_traffic_since = models.DateTimeField(null=True, blank=True)
    response_alert_id = models.BigIntegerField(null=True, blank=True)
    incident = models.ForeignKey(
        Incident, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    pid_before_restart = models.IntegerField(null=True, blank=True)
    # The worker carrying out the response claims it (a lease: a worker killed on the way
    # leaves it to the task's redelivery once the lease has run out, never to two at once).
    recovery_claimed_at = models.DateTimeField(null=True, blank=True)
    # Asked of the replica's SDK in its next heartbeat reply ("drain", "restart"), when the
    # console cannot act from outside (the replica runs on another host).
    pending_action = models.CharField(max_length=16, blank=True)
    restarts = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "name"], name="replica_once_per_job"),
        ]
        ordering = ["job_id", "name"]

    def __str__(self) -> str:
        return f"replica {self.backend}/{self.name} of job {self.job_id} ({self.status})"
