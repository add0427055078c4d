"""Real sandboxes for the readiness tests: cgroups, a PID + mount namespace, a small tmpfs as
/dev/shm, ulimits — what this machine allows, probed, never pretended.

cgroups: a v2 child cgroup when the v2 hierarchy delegates the memory and cpu controllers;
else the v1 ``memory`` and ``cpu`` hierarchies (a hybrid host: v2 mounted, but its memory and
cpu controllers bound to v1). Every cgroup made here is removed at the end, after its
processes are gone.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


@dataclass
class Cgroups:
    version: int
    folders: list[Path] = field(default_factory=list)

    def join(self) -> None:
        """In the child, before exec: move this process into every folder."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(os.getpid()))


def _v2_root() -> Path | None:
    for candidate in (ROOT, ROOT / "unified"):
        controllers = candidate / "cgroup.subtree_control"
        if controllers.exists() and {"memory", "cpu"} <= set(controllers.read_text().split()):
            return candidate
    return None


def why_not() -> str | None:
    """None when this machine can run the sandboxes; else the sentence saying why not."""
    if os.geteuid() != 0:
        return "needs root (cgroups, mount and PID namespaces)"
    if shutil.which("unshare") is None:
        return "needs unshare (util-linux)"
    if _v2_root() is None and not ((ROOT / "memory").is_dir() and (ROOT / "cpu").is_dir()):
        return "no cgroup v2 with memory+cpu delegated, and no v1 memory/cpu hierarchy"
    probe = subprocess.run(
        ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "true"], capture_output=True
    )
    if probe.returncode != 0:
        return f"unshare --mount --pid is refused here: {probe.stderr.decode()[-200:]}"
    return None


@contextlib.contextmanager
def cgroups(name: str, memory_bytes: int, cpus: float) -> Iterator[Cgroups]:
    v2 = _v2_root()
    made: Cgroups
    period = 100_000
    if v2 is not None:
        folder = v2 / name
        folder.mkdir()
        (folder / "memory.max").write_text(str(memory_bytes))
        (folder / "cpu.max").write_text(f"{int(cpus * period)} {period}")
        made = Cgroups(2, [folder])
    else:
        memory, cpu = ROOT / "memory" / name, ROOT / "cpu" / name
        memory.mkdir()
        cpu.mkdir()
        (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
        (cpu / "cpu.cfs_period_us").write_text(str(period))
        (cpu / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
        made = Cgroups(1, [memory, cpu])
    try:
        yield made
    finally:
        for folder in made.folders:
            with contextlib.suppress(OSError):
                folder.rmdir()


def sandboxed(
    command: str, *, cgroup: Cgroups, shm_bytes: int | None, memlock: int | None, env, log
) -> subprocess.Popen:
    """``command`` (a shell line) as PID 1 of a new PID + mount namespace, in ``cgroup``, with
    a fresh tmpfs of ``shm_bytes`` on /dev/shm (None: the host's) and RLIMIT_MEMLOCK lowered to
    ``memlock`` (None: left as it is)."""
    mount = f"mount -t tmpfs -o size={shm_bytes} tmpfs /dev/shm && " if shm_bytes else ""

    def before_exec() -> None:
        cgroup.join()
        if memlock is not None:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (memlock, memlock))

    return subprocess.Popen(
        ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "sh", "-c", mount + command],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=before_exec,
    )


def can_raise_memlock() -> bool:
    """Raising RLIMIT_MEMLOCK's hard limit needs CAP_SYS_RESOURCE, which containers often drop."""
    probe = subprocess.run(["sh", "-c", "ulimit -l unlimited"], capture_output=True)
    return probe.returncode == 0


def build_wheel(folder: Path, name: str = "late_extra", version: str = "0.1") -> Path:
    """A real (tiny) wheel, for pip to install while the sandbox runs."""
    import base64
    import hashlib
    import zipfile

    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": "VALUE = 1\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(text)}")
        record.append(f"{info}/RECORD,,")
        archive.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel
