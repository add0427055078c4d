"""Teams, roles, jobs, nodes and agent tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models

# AppendOnlyError is re-exported: callers catch it from here.
from core.append_only import AppendOnlyError, AppendOnlyModel, AppendOnlyQuerySet  # noqa: F401

TOKEN_PREFIX = "bkl_"


class Role(models.TextChoices):
    # Ordered: each role may do everything the one before it may (see incidents.teams.authority).
    VIEWER = "viewer", "Viewer"
    ONCALL = "oncall", "On-call"
    MANAGER = "manager", "Manager"
    ADMIN = "admin", "Admin"


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_role_per_team")]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.team}"


class JobKind(models.TextChoices):
    TRAINING = "training", "Training"
    INFERENCE = "inference", "Inference"


class JobStatus(models.TextChoices):
    PENDING = "pending", "Pending"  # created, the agent has not spoken yet
    RUNNING = "running", "Running"
    PAUSING = "pausing", "Pausing"  # checkpoint_and_pause issued, not yet confirmed saved
    PAUSED = "paused", "Paused"
    TERMINATED = "terminated", "Terminated"
    FINISHED = "finished", "Finished"


# The job's one state machine: every way its status changes, by event, as {from: to}. The
# transition table, and every list of statuses the code asks about (what may be paused,
# resumed, terminated; which statuses are final), are derived from it — never written out.
JOB_EVENTS: dict[str, dict[str, str]] = {
    # the agent's first heartbeat or point
    "start": {JobStatus.PENDING: JobStatus.RUNNING},
    # a checkpoint_and_pause is issued (by anyone: a person, an escalation, a breaker)
    "pause": {JobStatus.PENDING: JobStatus.PAUSING, JobStatus.RUNNING: JobStatus.PAUSING},
    # the agent acknowledged its checkpoint and holds
    "paused": {JobStatus.RUNNING: JobStatus.PAUSED, JobStatus.PAUSING: JobStatus.PAUSED},
    # the agent acknowledged a resume (or a roll back)
    "resume": {JobStatus.PAUSING: JobStatus.RUNNING, JobStatus.PAUSED: JobStatus.RUNNING},
    # a new process of the paused job says it trains: restarted outside the console (from a
    # checkpoint, by a person or a scheduler's requeue). It trains, so its breakers must act:
    # left "paused", every automatic brake would be refused as already done.
    "restart": {JobStatus.PAUSED: JobStatus.RUNNING},
    # the agent exited on a terminate, or an executor stopped it from outside
    "terminate": {
        JobStatus.PENDING: JobStatus.TERMINATED,
        JobStatus.RUNNING: JobStatus.TERMINATED,
        JobStatus.PAUSING: JobStatus.TERMINATED,
        JobStatus.PAUSED: JobStatus.TERMINATED,
    },
    # the agent's last heartbeat said it finished its run
    "finish": {JobStatus.PENDING: JobStatus.FINISHED, JobStatus.RUNNING: JobStatus.FINISHED},
}


def _transitions(events: dict[str, dict[str, str]]) -> dict[str, set[str]]:
    table: dict[str, set[str]] = {status: set() for status in JobStatus.values}
    for moves in events.values():
        for before, after in moves.items():
            table[before].add(after)
    return table


JOB_TRANSITIONS: dict[str, set[str]] = _transitions(JOB_EVENTS)


def job_statuses_for(event: str) -> tuple[str, ...]:
    """The statuses from which ``event`` may happen, in the order JobStatus declares them."""
    return tuple(status for status in JobStatus.values if status in JOB_EVENTS[event])


# Statuses with no way out: the job is over and takes no more commands.
FINAL_JOB_STATUSES: tuple[str, ...] = tuple(s for s, out in JOB_TRANSITIONS.items() if not out)
# Statuses in which the job trains (and so can be paused, or mitigated).
TRAINING_JOB_STATUSES: tuple[str, ...] = job_statuses_for("pause")
# Statuses whose agents have not acknowledged a hold yet: their points still flow, so the
# detectors' periodic ticks judge them.
UNHELD_JOB_STATUSES: tuple[str, ...] = job_statuses_for("paused")


def _after_start() -> set[str]:
    reached, todo = set(), list(JOB_EVENTS["start"].values())
    while todo:
        status = todo.pop()
        if status not in reached:
            reached.add(status)
            todo.extend(JOB_TRANSITIONS[status])
    return reached


# Statuses in which the job's processes exist and heartbeat (a held rank says "paused"): from
# its start until a final status. Silence in any of them is a rank that died or hung.
LIVE_JOB_STATUSES: tuple[str, ...] = tuple(
    s for s in JobStatus.values if s in _after_start() and s not in FINAL_JOB_STATUSES
)


class AgentStatus(models.TextChoices):
    """What the training process last said of itself in a heartbeat."""

    RUNNING = "running", "Running"
    PAUSED = "paused", "Paused"
    CHECKPOINTING = "checkpointing", "Checkpointing"
    FINISHED = "finished", "Finished"
    # Its step guard refused a non-finite update and it waits, at that step, for the console's
    # decision: it trains no further, so a command for it is applied where it holds.
    HOLDING = "holding", "Holding (step guard)"


class Job(models.Model):
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=JobKind.choices, default=JobKind.TRAINING)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING)
    agent_status = models.CharField(max_length=16, choices=AgentStatus.choices, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    last_metric_at = models.DateTimeField(null=True, blank=True)
    current_step = models.BigIntegerField(null=True, blank=True)
    # Step and time of the last heartbeat, kept apart from current_step (which metrics move
    # too) so the step time is measured between two heartbeats only.
    last_heartbeat_step = models.BigIntegerField(null=True, blank=True)
    # Seconds per training step, measured from successive heartbeats (moving average).
    step_time_seconds = models.FloatField(null=True, blank=True)
    # When the next heartbeat is due at the latest; the watchdog's one indexed query reads it.
    heartbeat_deadline = models.DateTimeField(null=True, blank=True, db_index=True)
    # Set when the watchdog raised the heartbeat alert of this silence (edge trigger: once per
    # episode); cleared by the next heartbeat, which also resolves that alert.
    heartbeat_overdue_since = models.DateTimeField(null=True, blank=True)
    heartbeat_timeout_seconds = models.FloatField(
        null=True, blank=True, help_text="Leave empty for the default: 8x the measured step time."
    )
    agent_pid = models.IntegerField(null=True, blank=True)
    agent_hostname = models.CharField(max_length=255, blank=True)
    # The identity of ``agent_pid`` on the console's host: its start time (clock ticks after
    # boot, /proc/PID/stat field 22), read by the console when a heartbeat first reported the
    # pid from this very host; None when it did not (another host, no hostname, no such
    # process). The local executor signals only a process whose start time is still this one.
    agent_pid_start_time = models.BigIntegerField(null=True, blank=True)
    # How many ranks the job runs, as its ranks report it (WORLD_SIZE); None when none said.
    world_size = models.IntegerField(null=True, blank=True)
    # Created by a fire drill (breakers.drills): takes inject_fault, and its pages say DRILL.
    drill_sandbox = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "name"], name="job_name_unique_in_team")
        ]

    def __str__(self) -> str:
        return f"{self.team.name}/{self.name}"


class JobRank(models.Model):
    """One rank (process) of a job as its heartbeats describe it: written by
    ``incidents.heartbeats.record_heartbeat`` only, by the rank's own beats without the job's row
    lock. Each rank has its own deadline; the job's own ``heartbeat_deadline`` is never later
    than the earliest of them (``incidents.heartbeats.past_deadline``), so the watchdog's query on
    jobs still finds a job with one silent rank while the others go on heartbeating."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="ranks")
    rank = models.IntegerField()
    pid = models.IntegerField(null=True, blank=True)
    # As Job.agent_pid_start_time: read by the console, only for a pid on the console's host.
    pid_start_time = models.BigIntegerField(null=True, blank=True)
    hostname = models.CharField(max_length=255, blank=True)
    step = models.BigIntegerField()
    step_time_seconds = models.FloatField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField()
    # None once the rank said it finished: a finished rank is never overdue.
    heartbeat_deadline = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=AgentStatus.choices)
    # Where the rank is in its step, as its heartbeats say (the SDK measures both; null when
    # it never said): the latest step whose gradient sync (the collective every rank meets in)
    # it entered — a rank blocked there says a step above ``step`` — and its own compute time
    # per step, the wait for the other ranks left out (the straggler check's basis).
    sync_step = models.BigIntegerField(null=True, blank=True)
    compute_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "rank"], name="rank_unique_in_job")]
        # Every heartbeat reads its job's earliest rank deadline: one index probe, not a scan
        # of a thousand ranks.
        indexes = [models.Index(fields=["job", "heartbeat_deadline"], name="rank_deadline")]
        ordering = ["job", "rank"]

    def __str__(self) -> str:
        return f"{self.job_id} rank {self.rank}"


class NodeStatus(models.TextChoices):
    HEALTHY = "healthy", "Healthy"
    FAILED = "failed", "Failed"
    ISOLATED = "isolated", "Isolated"


# A node is isolated (drained) once the job or its scheduler confirms it, and healthy again
# only when a person returns it to service.
NODE_TRANSITIONS: dict[str, set[str]] = {
    NodeStatus.HEALTHY: {NodeStatus.FAILED, NodeStatus.ISOLATED},
    NodeStatus.FAILED: {NodeStatus.ISOLATED, NodeStatus.HEALTHY},
    NodeStatus.ISOLATED: {NodeStatus.HEALTHY},
}
ISOLATABLE_NODE_STATUSES = tuple(
    s for s, out in NODE_TRANSITIONS.items() if NodeStatus.ISOLATED in out
)


class Node(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="nodes")
    hostname = models.CharField(max_length=200)
    rank = models.IntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=NodeStatus.choices, default=NodeStatus.HEALTHY)
    first_seen_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "hostname"], name="node_unique_in_job")
        ]

    def __str__(self) -> str:
        return self.hostname


def hash_token(raw_token: str) -> str:
    # Agent tokens are 256-bit random strings, so a fast unsalted hash is safe here (no
    # dictionary to attack), and it keeps per-request authentication to one index lookup.
    return hashlib.sha256(raw_token.encode()).hexdigest()


class AgentToken(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tokens")
    token_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12, help_text="The first characters, to recognise it.")
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… for {self.job}"

    @classmethod
    def issue(cls, job: Job) -> tuple[AgentToken, str]:
        """Create a token for ``job``; the raw token is returned once and never stored."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(job=job, token_hash=hash_token(raw), prefix=raw[:12])
        return token, raw
