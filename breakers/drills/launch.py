"""Starting the drill workload the way the job's executor runs jobs: a local process, or a
batch job submitted with ``sbatch`` (the same Slurm the Slurm executor acts through).

The sandbox's environment is built from an allowlist (``DRILL_ENVIRONMENT_ALLOWLIST``: PATH,
HOME, the locale...), never the console's own: a training command — the team's own, above all —
must not read the console's database URL, secret key or provider tokens. It carries the job's
token (the local executor signals only a process whose environment holds it),
``BRAKELINE_DRILL_SANDBOX=1`` (the SDK's own consent to faults), where to checkpoint and where
the SDK notes that the release hooks ran, and, on Slurm, ``--comment=brakeline:<job id>``,
which the console checks with Slurm before it binds the job and acts on it through Slurm.

A local sandbox is started through ``sandbox_exec`` (``sandboxed``): its parent process holds
only that environment, it runs as ``BRAKELINE_DRILL_SANDBOX_USER`` when the console runs as
root, and without any capability, so it cannot read the environment of the console's processes
(which are not dumpable: ``core.hardening``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from incidents.models import Job

SANDBOX_VARIABLE = "BRAKELINE_DRILL_SANDBOX"  # the SDK's (brakeline._drill.SANDBOX_VARIABLE)
RELEASE_MARKER_VARIABLE = "BRAKELINE_DRILL_RELEASE_MARKER"  # brakeline._drill's
RELEASE_MARKER = "released"  # in the sandbox's folder: the SDK ran the release hooks


def base_environment() -> dict[str, str]:
    """The allowlisted part of the console's environment (the verifier gets only this)."""
    allowed = settings.DRILL_ENVIRONMENT_ALLOWLIST
    env = {name: os.environ[name] for name in allowed if name in os.environ}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


STOP_WAIT_SECONDS = 30.0  # for sandbox_exec to reap its killed workload and exit
SANDBOX_EXEC = str(Path(__file__).with_name("sandbox_exec.py"))


def sandboxed(arguments: list[str], pid_fd: int | None = None) -> list[str]:
    """The command line that runs ``arguments`` under ``sandbox_exec`` (see the module)."""
    user = ["--user", settings.DRILL_SANDBOX_USER] if settings.DRILL_SANDBOX_USER else []
    pid = ["--pid-fd", str(pid_fd)] if pid_fd is not None else []
    return [sys.executable, "-I", SANDBOX_EXEC, *user, *pid, "--", *arguments]


def sandbox_environment(url: str, token: str, work_dir: Path) -> dict[str, str]:
    env = base_environment()
    env.update(
        BRAKELINE_URL=url,
        BRAKELINE_TOKEN=token,
        BRAKELINE_CHECKPOINT_DIR=str(work_dir / "checkpoints"),
        BRAKELINE_SPILL_DIR=str(work_dir / "spill"),
        **{SANDBOX_VARIABLE: "1", RELEASE_MARKER_VARIABLE: str(work_dir / RELEASE_MARKER)},
        TRAIN_DIR=str(work_dir),
    )
    return env


@dataclass
class Sandbox:
    executor: str
    work_dir: Path
    process: subprocess.Popen | None = None  # local: sandbox_exec, the workload's parent
    pid: int = 0  # local: the workload itself, leader of its own session
    slurm_job_id: str = ""
    _stopped: bool = field(default=False)

    @property
    def log(self) -> Path:
        return self.work_dir / "workload.log"

    def tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"

    def exit_code(self) -> int | None:
        if self.process is not None:
            return self.process.poll()
        return None if self.alive() else _slurm_exit_code(self.work_dir)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return _slurm_state(self.slurm_job_id) in ("PENDING", "RUNNING", "COMPLETING")

    def exited_early(self) -> bool:
        return not self.alive()

    def describe(self) -> str:
        """Where the workload runs, for the progress lines (its pid, or its Slurm job)."""
        if self.process is not None:
            return f"pid {self.pid}"
        return f"Slurm job {self.slurm_job_id}"

    def stop(self) -> None:
        """Kill the workload and whatever it started: the whole session it leads (its own,
        ``start_new_session``), even once the workload itself has exited, so no child of it
        (a launcher's ranks, a loader's workers) is left behind as an orphan. The group id is
        the workload's pid, which the kernel does not reuse while any member of the group is
        alive."""
        if self.process is not None:
            if self.pid > 1:  # never group 0 (our own) or 1
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.pid, signal.SIGKILL)
            # sandbox_exec reaps the workload, then exits of the same signal: killing it first
            # would leave the workload a zombie nobody reaps.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(STOP_WAIT_SECONDS)
            if self.process.poll() is None:  # the workload outlived SIGKILL (uninterruptible)
                self.process.kill()
            self.process.wait()
        elif self.slurm_job_id and self.alive():
            _slurm(["scancel", self.slurm_job_id])


def launch_sandbox(
    executor: str, job: Job, token: str, url: str, work_dir: Path, arguments: list[str]
) -> Sandbox:
    """Start ``arguments`` (the workload's command line, run without a shell) in ``work_dir``."""
    work_dir.mkdir(parents=True, exist_ok=True)
    env = sandbox_environment(url, token, work_dir)
    if executor == "slurm":
        return _submit(job, env, arguments, work_dir)
    with open(work_dir / "workload.log", "wb") as output:
        # The workload leads a session of its own (sandbox_exec starts it so), as a scheduler's
        # job has: the local executor never signals a process in the console's own process
        # group (which the runner may share).
        _hand_over(work_dir)
        reader, writer = os.pipe()
        try:
            process = subprocess.Popen(
                sandboxed(arguments, writer),
                cwd=work_dir,
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=(writer,),
            )
        finally:
            os.close(writer)
        with os.fdopen(reader) as pid_line:  # sandbox_exec writes it once the workload runs
            pid = int(pid_line.readline() or process.pid)
    return Sandbox("local", work_dir, process=process, pid=pid)


def _hand_over(work_dir: Path) -> None:
    """The sandbox user owns its folder (it writes its checkpoints and log there)."""
    if not settings.DRILL_SANDBOX_USER or os.geteuid() != 0:
        return
    import pwd

    user = settings.DRILL_SANDBOX_USER
    entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    for path in (work_dir, *work_dir.rglob("*")):
        os.chown(path, entry.pw_uid, entry.pw_gid)


def slurm_available() -> bool:
    """Whether this console can submit to Slurm (``sbatch`` in BRAKELINE_SLURM_BIN_DIR, or on
    the PATH): the drills page offers the Slurm executor only then."""
    return shutil.which(_slurm_binary("sbatch")) is not None


def _slurm_binary(name: str) -> str:
    """A Slurm command in BRAKELINE_SLURM_BIN_DIR, or by name on the PATH."""
    return str(Path(settings.SLURM_BIN_DIR) / name) if settings.SLURM_BIN_DIR else name


def _slurm(arguments: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """A Slurm command of the console's Slurm settings (BRAKELINE_SLURM_BIN_DIR, SLURM_CONF)."""
    command = [_slurm_binary(arguments[0]), *arguments[1:]]
    env = dict(os.environ if env is None else env)
    if settings.SLURM_CONF:
        env["SLURM_CONF"] = settings.SLURM_CONF
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=settings.SLURM_COMMAND_TIMEOUT_SECONDS,
        check=False,
        env=env,
    )


def _submit(job: Job, env: dict[str, str], arguments: list[str], work_dir: Path) -> Sandbox:
    # The exit code lands in a file: without accounting, Slurm forgets a finished job. The
    # arguments are quoted: a team's command line is data, never shell code.
    script = f"{shlex.join(arguments)}; echo $? > {shlex.quote(str(work_dir))}/exit-code"
    submitted = _slurm(
        [
            "sbatch",
            "--parsable",
            f"--comment=brakeline:{job.pk}",
            f"--job-name=brakeline-drill-{job.pk}",
            f"--chdir={work_dir}",
            f"--output={work_dir}/workload.log",
            f"--wrap={script}",
        ],
        env=env,
    )
    if submitted.returncode != 0:
        raise OSError(f"sbatch refused the drill workload: {submitted.stderr.strip()}")
    return Sandbox("slurm", work_dir, slurm_job_id=submitted.stdout.strip().split(";")[0])


def _slurm_state(slurm_job_id: str) -> str:
    if not slurm_job_id:
        return ""
    answer = _slurm(["squeue", "--noheader", "--format=%T", f"--jobs={slurm_job_id}"])
    return answer.stdout.strip() if answer.returncode == 0 else ""


def _slurm_exit_code(work_dir: Path) -> int | None:
    path = work_dir / "exit-code"
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
