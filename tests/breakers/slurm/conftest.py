"""A real single-node Slurm, started by the suite: munged, slurmctld and slurmd (Debian 12's
packages) as background processes, with a slurm.conf under a temporary folder, stopped by PID at
the end of the session. The node is named ``localhost`` and has the machine's real CPUs and
memory (``slurmd -C``). Without the binaries the Slurm tests are skipped, saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "scontrol", "squeue", "sinfo")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])
MISSING = [name for name in BINARIES if shutil.which(name, path=SEARCH_PATH) is None]
requires_slurm = pytest.mark.skipif(
    bool(MISSING),
    reason=f"Slurm is not installed (missing {', '.join(MISSING)}): "
    "apt-get install -y slurmctld slurmd slurm-client munge",
)
NODE = "localhost"
CONF = """\
ClusterName=brakeline-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.sock,cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
ReturnToService=2
KillWait=5
NodeName={node} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


def binary(name: str) -> str:
    return shutil.which(name, path=SEARCH_PATH) or name


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    node: str = NODE
    daemons: list[subprocess.Popen] = field(default_factory=list)

    @property
    def bin_dir(self) -> str:
        return os.path.dirname(binary("scancel"))

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def run(
        self, *arguments: str, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        if arguments[0] == "sbatch" and not any(a.startswith("--output") for a in arguments):
            # Else Slurm writes slurm-<id>.out into the current folder: the repository.
            arguments = (arguments[0], f"--output={self.root}/slurm-%j.out", *arguments[1:])
        return subprocess.run(
            [binary(arguments[0]), *arguments[1:]],
            env=env or self.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
        )

    def job_state(self, job_id: str) -> str:
        result = self.run("squeue", "-h", "-j", job_id, "--states=all", "-o", "%T", check=False)
        return result.stdout.strip() or "GONE"

    def job_field(self, job_id: str, name: str) -> str:
        shown = self.run("scontrol", "show", "job", "-o", job_id).stdout
        match = re.search(rf"\b{name}=(\S+)", shown)
        return match.group(1) if match else ""

    def node_state(self) -> tuple[str, str]:
        """(State, Reason) of the node, as ``scontrol show node`` shows them."""
        shown = self.run("scontrol", "show", "node", "-o", self.node).stdout
        state = re.search(r"\bState=(\S+)", shown).group(1)
        reason = shown.partition(" Reason=")[2].strip()
        return state, reason

    def wait_until_idle(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
            if result.stdout.strip() == "idle":
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Slurm node is not idle after {timeout} s: {result.stdout!r}")

    def cancel_everything(self, timeout: float = 20.0) -> None:
        """Cancel every job and wait until none runs: slurmd must not leave job steps behind."""
        self.run("scancel", "--user", "root", check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.run("squeue", "-h", "-o", "%T", check=False).stdout.split()
            if not states:
                return
            time.sleep(0.2)


def _hardware() -> str:
    """CPUs, sockets, cores, threads and memory as ``slurmd -C`` reports them."""
    reported = subprocess.run(
        [binary("slurmd"), "-C"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.splitlines()[0]
    return " ".join(word for word in reported.split() if not word.startswith("NodeName="))


def _start(cluster: SlurmCluster, log_name: str, *argv: str) -> subprocess.Popen:
    log = open(cluster.root / "log" / log_name, "wb")  # noqa: SIM115  (kept open while it runs)
    process = subprocess.Popen(
        [binary(argv[0]), *argv[1:]],
        cwd=cluster.root,
        env=cluster.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a Ctrl-C of pytest reaches the tests, not the daemons
    )
    cluster.daemons.append(process)
    return process


def _start_munge(cluster: SlurmCluster) -> None:
    munge = cluster.root / "munge"
    munge.mkdir(mode=0o755)
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    _start(
        cluster,
        "munged.out",
        "munged",
        "--foreground",
        "--force",  # root, and a folder under /tmp: munged's ownership checks would refuse
        f"--key-file={key}",
        f"--socket={munge / 'munge.sock'}",
        f"--pid-file={munge / 'munged.pid'}",
        f"--seed-file={munge / 'munged.seed'}",
        f"--log-file={cluster.root / 'log' / 'munged.log'}",
    )
    deadline = time.monotonic() + 10
    while not (munge / "munge.sock").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("munged did not create its socket")
        time.sleep(0.05)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    if MISSING:
        pytest.skip(f"Slurm is not installed (missing {', '.join(MISSING)})")
    root = Path(tempfile.mkdtemp(prefix="brakeline-slurm-"))
    root.chmod(0o755)
    for folder in ("state", "spool", "log", "jobs"):
        (root / folder).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(
        CONF.format(
            root=root,
            node=NODE,
            hardware=_hardware(),
            ctld_port=free_port(),
            slurmd_port=free_port(),
        )
    )
    cluster = SlurmCluster(root=root, conf=conf)
    try:
        _start_munge(cluster)
        _start(cluster, "slurmctld.out", "slurmctld", "-D", "-c", "-i")
        _start(cluster, "slurmd.out", "slurmd", "-D", "-N", NODE)
        cluster.wait_until_idle()
        yield cluster
    finally:
        if len(cluster.daemons) == 3:
            cluster.cancel_everything()
        for process in reversed(cluster.daemons):  # slurmd, slurmctld, then munged
            _stop(process)
        if not os.environ.get("BRAKELINE_KEEP_SLURM"):  # set it to read the daemons' logs
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def _console_uses_the_test_cluster(request, settings) -> Iterator[None]:
    """The console's Slurm settings point at this cluster (SLURM_BIN_DIR, SLURM_CONF)."""
    if MISSING:
        yield
        return
    cluster = request.getfixturevalue("slurm_cluster")
    settings.SLURM_BIN_DIR = cluster.bin_dir
    settings.SLURM_CONF = str(cluster.conf)
    yield
    # The next test starts from an idle node: nothing running, nothing drained.
    cluster.cancel_everything()
    state, _ = cluster.node_state()
    if "DRAIN" in state:
        cluster.run("scontrol", "update", f"nodename={cluster.node}", "state=resume")
    cluster.wait_until_idle()
