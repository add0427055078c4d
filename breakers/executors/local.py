"""Out-of-band executors: stopping a job without its cooperation, when it is hung.

The control plane asks the job first (a command it acknowledges). When the acknowledgement
does not come in time the job is presumed hung, and an executor stops it from the outside.
Executors sit behind one small interface (``breakers.executors.outcome.Executor``) so the
scheduler-specific ones (Slurm, Kubernetes) plug in next to this local-process default; the job's
scheduler binding picks one (``breakers.executors.scheduler.executor_for``).
"""

from __future__ import annotations

from breakers.executors.outcome import ExecutorOutcome
from breakers.executors.targets import register
from breakers.executors.whole_job import stop_whole_job
from incidents.models import Job


class LocalProcessExecutor:
    """Stops the whole job on this host (``breakers.executors.whole_job``): its launchers'
    process groups (torchrun's agent stops its workers and restarts nothing) and the ranks no
    launcher holds; SIGTERM, then SIGKILL after the grace, each process proven to be the job's
    right before each signal (start time, not merely "alive": pids wrap)."""

    name = "local"

    def stop(self, job: Job, *, grace_seconds: float) -> ExecutorOutcome:
        return stop_whole_job(job, grace_seconds=grace_seconds, executor=self.name)


register(
    LocalProcessExecutor.name,
    "breakers.executors.whole_job",
    acts_on="the job's launchers and ranks registered from this host, each proven before "
    "each signal (start time, job token)",
    check="local_process",
)
