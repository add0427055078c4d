"""The launchers a job's ranks run under (torchrun's elastic agent), as their heartbeats say.

The executor stops a job through its launcher — the agent's process group, so the agent stops
its workers and cannot restart them — never through one rank's pid alone
(``breakers.executors.whole_job``). A row per (job, host, launcher pid): a multi-node torchrun has
an agent per node. ``start_time`` is what the console read from /proc when the launcher was
first reported from the console's own host *as the parent of that rank's process*; only such a
launcher is ever signalled, and only while its start time is still that one (pids wrap).
"""

from __future__ import annotations

from django.db import models

from incidents.models import Job

__all__ = ["JobLauncher"]


class JobLauncher(models.Model):
    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="launchers")
    hostname = models.CharField(max_length=255, blank=True)
    pid = models.IntegerField()
    pgid = models.IntegerField()
    # What the rank reported (proc(5) field 22 of its parent, read on its own host).
    reported_start_time = models.BigIntegerField()
    # What the console read itself, on this host, at registration; NULL: never verified here
    # (another host, or the reported one did not match): then it is never signalled locally.
    start_time = models.BigIntegerField(null=True, blank=True)
    ranks = models.JSONField(default=list)  # the ranks reported under it
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["job", "hostname", "pid", "reported_start_time"], name="launcher_once"
            )
        ]
        ordering = ["job", "hostname", "pid"]

    def __str__(self) -> str:
        return f"launcher {self.pid} of job {self.job_id} on {self.hostname or '?'}"
