"""What the console grades a job's sandbox from: the process, its container, its limits.

Read from /proc and /sys only (stdlib, no subprocess): the whole probe takes ~16 ms with 147
distributions installed, nearly all of it the scan for late installs (bench/sandbox_probe.py).
Every probe answers None rather than raise, because a snapshot must never fail the run; the
console says "unknown" for what is None.

cgroups: the limits that count are those of the cgroup this process is in, and of each of its
ancestors (a parent's limit caps its children), read from the v2 hierarchy when the process is
in one, else from the v1 ``memory`` and ``cpu`` controllers (hybrid hosts still mount those).
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
# A v1 "no limit" is the largest page-aligned 63-bit number, not a word.
_V1_UNLIMITED = 2**62
_CONTAINER_MARKERS = ("docker", "kubepods", "containerd", "libpod", "lxc", "crio")
_INSTALLERS = ("pip", "pip3", "conda", "mamba", "micromamba", "uv", "poetry", "apt-get", "apt")


def _read(path: Path | str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


def _boot_time() -> float | None:
    for line in (_read("/proc/stat") or "").splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return None


def process_started_at(pid: int | str = "self") -> float | None:
    """Unix time the process started (from /proc/PID/stat field 22, in clock ticks)."""
    stat = _read(f"/proc/{pid}/stat")
    boot = _boot_time()
    if stat is None or boot is None:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return boot + int(fields[19]) / _clock_ticks()
    except (IndexError, ValueError):
        return None


def command_line(pid: int | str = "self") -> list[str] | None:
    raw = None
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def installers_in(command: Iterable[str] | None) -> list[str]:
    """Package installers a start-up command runs (``sh -c "pip install x && python t.py"``)."""
    words: list[str] = []
    for part in command or ():
        words.extend(part.replace("&&", " ").replace(";", " ").replace("|", " ").split())
    found = []
    for index, word in enumerate(words):
        name = word.rsplit("/", 1)[-1]
        following = words[index + 1 : index + 3]
        is_module = name.startswith("python") and following[:1] == ["-m"]
        tool = following[1] if is_module and len(following) > 1 else name
        tool = tool.rsplit("/", 1)[-1]
        if tool in _INSTALLERS and "install" in words[index + 1 : index + 4] and tool not in found:
            found.append(tool)
    return found


def container_context(environ: dict[str, str] | Any) -> dict[str, Any]:
    """Whether the process runs in a container, and when the container (its PID 1) started."""
    cgroups = _read("/proc/self/cgroup") or ""
    reasons = []
    if Path("/.dockerenv").exists():
        reasons.append("/.dockerenv")
    if Path("/run/.containerenv").exists():
        reasons.append("/run/.containerenv")
    if environ.get("container"):
        reasons.append(f"container={environ['container']}")
    if environ.get("KUBERNETES_SERVICE_HOST"):
        reasons.append("KUBERNETES_SERVICE_HOST")
    if any(marker in cgroups for marker in _CONTAINER_MARKERS):
        reasons.append("/proc/self/cgroup")
    return {
        "in_container": bool(reasons),
        "evidence": reasons,
        # In a PID namespace, PID 1 is the container's init: its start is the container's.
        "init_started_at": process_started_at(1),
        "init_command": command_line(1),
    }


def _cgroup_paths() -> dict[str, str]:
    """Controller ("" for v2) -> this process's cgroup path."""
    paths: dict[str, str] = {}
    for line in (_read("/proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            for controller in parts[1].split(",") if parts[1] else [""]:
                paths[controller] = parts[2]
    return paths


def _v2_mount() -> Path | None:
    for candidate in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (candidate / "cgroup.controllers").exists():
            return candidate
    return None


def _ancestors(mount: Path, relative: str) -> list[Path]:
    """The cgroup's folder, then each parent's up to the mount (the mount itself included)."""
    current = mount / relative.lstrip("/")
    chain = []
    while True:
        chain.append(current)
        if current == mount or mount not in current.parents:
            return chain
        current = current.parent


def _tightest(values: list[float]) -> float | None:
    return min(values) if values else None


def _v2_limits(mount: Path, relative: str) -> dict[str, Any]:
    memory: list[float] = []
    cpu: list[float] = []
    for folder in _ancestors(mount, relative):
        value = _read(folder / "memory.max")
        if value and value != "max" and value.isdigit():
            memory.append(int(value))
        quota_period = (_read(folder / "cpu.max") or "").split()
        if len(quota_period) == 2 and quota_period[0] != "max":
            with contextlib.suppress(ValueError, ZeroDivisionError):
                cpu.append(int(quota_period[0]) / int(quota_period[1]))
    controllers = (_read(mount / relative.lstrip("/") / "cgroup.controllers") or "").split()
    return {
        "version": 2,
        "path": relative,
        "controllers": controllers,
        "memory_max_bytes": _tightest(memory),
        "cpu_max_cpus": _tightest(cpu),
    }


def _v1_limits(paths: dict[str, str]) -> dict[str, Any]:
    memory: list[float] = []
    cpu: list[float] = []
    if "memory" in paths:
        for folder in _ancestors(CGROUP_ROOT / "memory", paths["memory"]):
            value = _read(folder / "memory.limit_in_bytes")
            if value and value.isdigit() and int(value) < _V1_UNLIMITED:
                memory.append(int(value))
    cpu_controller = next((name for name in ("cpu", "cpu,cpuacct") if name in paths), None)
    if cpu_controller is not None:
        mount = next(
            (
                CGROUP_ROOT / name
                for name in ("cpu", "cpu,cpuacct")
                if (CGROUP_ROOT / name).exists()
            ),
            CGROUP_ROOT / "cpu",
        )
        for folder in _ancestors(mount, paths[cpu_controller]):
            quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
            if quota and period and quota.lstrip("-").isdigit() and int(quota) > 0:
                cpu.append(int(quota) / max(int(period), 1))
    return {
        "version": 1,
        "path": paths.get("memory", ""),
        "controllers": sorted(paths),
        "memory_max_bytes": _tightest(memory),
        "cpu_max_cpus": _tightest(cpu),
    }


def cgroup_limits() -> dict[str, Any]:
    """This process's effective cgroup memory and CPU limits (None: none set, or unreadable).

    v2 when the process's v2 cgroup has the memory controller; on a hybrid host (v2 mounted
    without memory/cpu, the v1 controllers holding them) the v1 values are the real ones."""
    paths = _cgroup_paths()
    mount = _v2_mount()
    has_v1 = any(name in paths for name in ("memory", "cpu", "cpu,cpuacct"))
    if has_v1:
        return _v1_limits(paths)
    if mount is not None and "" in paths:
        return _v2_limits(mount, paths[""])
    return {"version": None, "memory_max_bytes": None, "cpu_max_cpus": None}


def _limit(which: int) -> dict[str, int | None]:
    try:
        soft, hard = resource.getrlimit(which)
    except (OSError, ValueError):
        return {"soft": None, "hard": None}
    unlimited = resource.RLIM_INFINITY
    return {
        "soft": None if soft == unlimited else soft,
        "hard": None if hard == unlimited else hard,
    }


def ulimits() -> dict[str, Any]:
    """memlock (pinned memory for NCCL and pinned loaders), stack, open files; None: unlimited."""
    return {
        "memlock": _limit(resource.RLIMIT_MEMLOCK),
        "stack": _limit(resource.RLIMIT_STACK),
        "nofile": _limit(resource.RLIMIT_NOFILE),
    }


def shared_memory(path: str = "/dev/shm") -> dict[str, int | None]:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return {"total_bytes": None, "free_bytes": None}
    return {"total_bytes": usage.total, "free_bytes": usage.free}


def late_installed_packages(since: float | None) -> list[dict[str, Any]]:
    """Distributions whose metadata was written after ``since`` (the process's or container's
    start): installed while it ran, so a restart elsewhere would not have them."""
    if since is None:
        return []
    import importlib.metadata

    late: list[dict[str, Any]] = []
    seen: set[str] = set()
    for distribution in importlib.metadata.distributions():
        folder = getattr(distribution, "_path", None)
        if folder is None:
            continue
        # "torch-2.13.0.dist-info": the folder's name, not METADATA (parsing each one costs a
        # tenth of a second over a large environment).
        base = Path(folder).name.removesuffix(".dist-info").removesuffix(".egg-info")
        name = base.split("-", 1)[0] or base
        key = name.lower().replace("-", "_")
        if key in seen:
            continue  # found again further down sys.path: the first one is what imports
        seen.add(key)
        try:
            written = Path(folder).stat().st_mtime
        except OSError:
            continue
        # A second of slack: pip writes the metadata of the environment being started into.
        if written > since + 1.0:
            late.append({"name": name, "installed_at": written})
    late.sort(key=lambda item: item["installed_at"])
    return late


def loader_workers(loader: Any) -> int | None:
    """num_workers of the (wrapped) loader, when it says."""
    inner = getattr(loader, "loader", loader)
    workers = getattr(inner, "num_workers", None)
    return workers if isinstance(workers, int) and not isinstance(workers, bool) else None


def sandbox_facts(environ: Any, loader: Any = None, checkpoint_holds: Any = None) -> dict[str, Any]:
    """The ``sandbox`` section of a snapshot: everything readiness grading reads."""
    started = process_started_at()
    container = container_context(environ)
    since = container["init_started_at"] if container["in_container"] else started
    command = command_line()
    parent = command_line(os.getppid())
    late = late_installed_packages(since)
    # Who started this process counts too: `sh -c "pip install … && python train.py"`.
    started_by = [*(command or []), *(parent or []), *(container["init_command"] or [])]
    return {
        "process": {
            "pid": os.getpid(),
            "started_at": started,
            "command": command,
            "parent_command": parent,
        },
        "container": container,
        "installers_in_command": installers_in(started_by),
        # The count is every one of them; the list, the 50 most recent (a bounded snapshot).
        "late_installed_count": len(late),
        "late_installed_packages": late[-50:],
        "cgroup": cgroup_limits(),
        "shm": shared_memory(),
        "ulimits": ulimits(),
        "loader_workers": loader_workers(loader),
        "checkpoint_holds": dict(checkpoint_holds) if checkpoint_holds is not None else None,
        "probed_at": time.time(),
    }


def _cpu_model() -> str | None:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def _nvidia_driver() -> str | None:
    """The NVIDIA driver's version from /proc (present without torch), or None."""
    driver_line = (_read("/proc/driver/nvidia/version") or "").splitlines()[:1]
    return next(
        (
            word
            for word in (driver_line[0].split() if driver_line else [])
            if word[:1].isdigit() and "." in word
        ),
        None,
    )


def hardware(modules: dict[str, Any] | None = None) -> dict[str, Any]:
    """Accelerator models, driver, CUDA and cuDNN versions where present; the CPU model.

    torch is asked only when the run already imported it (importing it here would cost
    seconds); the NVIDIA driver's version is read from /proc, so it shows without torch."""
    import sys

    modules = sys.modules if modules is None else modules
    info: dict[str, Any] = {
        "cpu_model": _cpu_model(),
        "nvidia_driver": _nvidia_driver(),
        "cuda": None,
        "cudnn": None,
        "accelerators": [],
    }
    torch = modules.get("torch")
    if torch is None:
        return info
    try:
        info["cuda"] = getattr(torch.version, "cuda", None)
        cudnn = getattr(getattr(torch, "backends", None), "cudnn", None)
        if cudnn is not None and cudnn.is_available():
            info["cudnn"] = str(cudnn.version())
        if torch.cuda.is_available():
            info["accelerators"] = [
                {
                    "name": torch.cuda.get_device_name(i),
                    "memory_bytes": torch.cuda.get_device_properties(i).total_memory,
                }
                for i in range(torch.cuda.device_count())
            ]
    except Exception:  # a broken CUDA set-up must not fail the snapshot
        pass
    return info
