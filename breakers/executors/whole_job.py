"""Stopping a whole job on this host: every launcher and rank, never one rank's pid alone.

A hung rank blocks the others in their next collective; SIGTERM to the one pid that heartbeated
last stopped a healthy rank and left the hung one (and torchrun restarted the group). So the
executor stops what the job runs as:

1. **Launchers** (``JobLauncher``, torchrun's elastic agent) get SIGTERM on their process group
   when they lead it, else on their pid: the agent terminates its workers and exits without a
   restart (a signalled agent never relaunches).
2. **Ranks no verified launcher holds** get SIGTERM themselves.
3. After the grace, SIGKILL: launchers first (a dead agent can restart nothing), then every
   rank still there, orphans of a killed agent included.

Each signal is preceded by the identity check of its process (``identity``): its start time is
the one the console read when the process was registered, so a pid reused since is left
alone; a launcher or rank that fails it is named on the timeline and not signalled. A job with
unfinished ranks on another host is refused whole: only its scheduler can stop all of it.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from breakers.executors.identity import (
    environment_refusal,
    is_the_consoles_own,
    process_is_running,
)
from breakers.executors.outcome import ExecutorOutcome
from breakers.models import JobLauncher
from core.processes import process_group, process_start_time, this_host
from incidents.models import AgentStatus, Job, JobRank

KILL_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class Target:
    """One process of the job, as registered: what to signal and how to recognise it."""

    label: str  # "torchrun agent 812 (ranks 0, 1)", "rank 1 (pid 815)"
    pid: int
    start_time: int | None  # read by the console at registration; None: never verified here
    launcher: bool
    job_id: int

    def refusal(self) -> str | None:
        """Why this process must not be signalled now, None when it may (or is gone)."""
        if self.start_time is None:
            return f"{self.label} was never verified from this host (no start time recorded)"
        if is_the_consoles_own(self.pid):
            return f"{self.label} is PID 1 or one of the console's own processes"
        started = process_start_time(self.pid)
        if started is None:
            return None  # gone: nothing to signal
        if started != self.start_time:
            return (
                f"{self.label}: pid {self.pid} started at tick {started}, not at "
                f"{self.start_time} as the job's process did: the pid now belongs to another "
                "process"
            )
        if self.launcher:
            return None  # proven the rank's parent at registration, and the same process now
        job = Job(pk=self.job_id)
        return environment_refusal(job, self.pid)

    @property
    def group(self) -> bool:
        """A launcher leading its own process group is signalled as that group."""
        return self.launcher and process_group(self.pid) == self.pid

    def alive(self) -> bool:
        started = process_start_time(self.pid)
        return started is not None and started == self.start_time and process_is_running(self.pid)


@dataclass(frozen=True)
class JobProcesses:
    launchers: list[Target]
    free_ranks: list[Target]  # no verified launcher holds them: signalled themselves
    held_ranks: list[Target]  # under a launcher: its agent stops them; killed if it does not
    refusal: str = ""


def _not_all_here(elsewhere: list[tuple[int, str]], host: str) -> str:
    """Why a local signal cannot stop the job: the ranks on other hosts, named."""
    named = ", ".join(str(rank) for rank, _ in elsewhere[:8])
    hosts = sorted({name for _, name in elsewhere if name})[:4]
    where = (
        f"run on {', '.join(hosts)}" if hosts else "reported their process without naming its host"
    )
    return (
        f"rank(s) {named} {where}, not on this worker's host {host}: a local signal "
        "cannot stop the whole job (use the scheduler's executor)"
    )


def _rank_targets(job: Job, ranks: list[JobRank]) -> dict[int, Target]:
    """Each rank's registered process, by rank."""
    targets = {
        r.rank: Target(f"rank {r.rank} (pid {r.pid})", r.pid, r.pid_start_time, False, job.pk)
        for r in ranks
        if r.pid
    }
    if not ranks and job.agent_pid:  # heartbeats from before per-rank rows
        targets = {
            0: Target(
                f"process {job.agent_pid}", job.agent_pid, job.agent_pid_start_time, False, job.pk
            )
        }
    return targets


def job_processes(job: Job) -> JobProcesses:
    """The job's processes on this host, as registered."""
    host = this_host()
    ranks = list(JobRank.objects.filter(job=job).exclude(status=AgentStatus.FINISHED))
    elsewhere = sorted((r.rank, r.hostname) for r in ranks if r.hostname != host)
    if elsewhere:
        return JobProcesses([], [], [], _not_all_here(elsewhere, host))
    rows = list(JobLauncher.objects.filter(job=job, hostname=host, start_time__isnull=False))
    launchers = [
        Target(
            f"launcher {row.pid} (ranks {', '.join(map(str, row.ranks))})",
            row.pid,
            row.start_time,
            True,
            job.pk,
        )
        for row in rows
    ]
    # Only launchers still running as registered hold ranks: an earlier launch's agent that
    # is gone (or whose pid is another process's now) holds nobody.
    held = {r for row in rows if process_start_time(row.pid) == row.start_time for r in row.ranks}
    targets = _rank_targets(job, ranks)
    return JobProcesses(
        launchers,
        [t for rank, t in targets.items() if rank not in held],
        [t for rank, t in targets.items() if rank in held],
    )


def _signal(target: Target, signum: signal.Signals, steps: list[str]) -> None:
    why = target.refusal()
    if why is not None:
        steps.append(f"{signum.name} not sent, refused: {why}")
        return
    if not target.alive():
        return
    try:
        if target.group:
            os.killpg(target.pid, signum)
            steps.append(f"{signum.name} to the process group of {target.label}")
        else:
            os.kill(target.pid, signum)
            steps.append(f"{signum.name} to {target.label}")
    except ProcessLookupError:
        pass  # exited between the check and the signal


def _wait(targets: list[Target], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(t.alive() for t in targets):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def stop_whole_job(job: Job, *, grace_seconds: float, executor: str) -> ExecutorOutcome:
    started = time.monotonic()
    found = job_processes(job)
    if found.refusal:
        return ExecutorOutcome(executor, False, detail=f"refused: {found.refusal}")
    signalled = found.launchers + found.free_ranks  # launchers' agents stop their own workers
    watched = signalled + found.held_ranks
    if not watched:
        return ExecutorOutcome(executor, False, detail="The job never reported a process id.")
    refused = [why for t in watched if (why := t.refusal()) is not None]
    if len(refused) == len(watched):
        return ExecutorOutcome(executor, False, detail=f"refused: {'; '.join(refused)}")
    steps = [
        f"stopping the whole job: {len(found.launchers)} launcher(s) holding "
        f"{len(found.held_ranks)} rank(s), {len(found.free_ranks)} rank(s) outside a launcher "
        "(checked before each signal: this host, start time; ranks: job token)"
    ]
    for target in signalled:
        _signal(target, signal.SIGTERM, steps)
    if not _wait(watched, grace_seconds):
        steps.append(f"still running after {grace_seconds:g} s grace: SIGKILL")
        _kill_rest(watched, steps)
    stopped = not any(t.alive() for t in watched)
    steps.append("every process of the job exited" if stopped else _left(watched))
    return ExecutorOutcome(executor, stopped, steps, seconds=time.monotonic() - started)


def _kill_rest(watched: list[Target], steps: list[str]) -> None:
    for target in sorted(watched, key=lambda t: not t.launcher):  # launchers first
        if target.alive():
            _signal(target, signal.SIGKILL, steps)
    _wait(watched, KILL_WAIT_SECONDS)


def _left(watched: list[Target]) -> str:
    alive = [t.label for t in watched if t.alive()]
    return f"still running: {', '.join(alive)}"
