"""Environment snapshots: what a run needs to be reproduced, with secrets redacted.

Taken at start and at every checkpoint, in the control thread (collecting the package list can
take a tenth of a second). Every probe is defensive: a snapshot never fails and never blocks for
long (git runs with a timeout).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from brakeline._sandbox import hardware, sandbox_facts
from brakeline._version import __version__

REDACTED = "<redacted>"
SECRET_NAME_PARTS = (
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "KEY",
    "CREDENTIAL",
    "AUTH",
    "PRIVATE",
    "COOKIE",
    "SESSION",
    "SIGNATURE",
    "CERT",
    "DSN",
)
# Variables worth recording: they change numerics, data order, parallelism or placement.
SELECTED_ENV_PREFIXES = (
    "BRAKELINE_",
    "CUDA",
    "NCCL_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "SLURM_",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "ACCELERATE_",
    "DEEPSPEED_",
    "XLA_",
    "JAX_",
    "TF_",
    "NVIDIA_",
    "CUBLAS_",
    "CUDNN_",
    "PYTHON",
    "KUBERNETES_",
    "WANDB_",
    "LD_LIBRARY_PATH",
    "VIRTUAL_ENV",
    "CONDA_",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "IMAGE_DIGEST",
    "CONTAINER_IMAGE",
    "LANG",
    "LC_ALL",
    "TZ",
)
IMAGE_VARIABLES = ("BRAKELINE_IMAGE", "IMAGE_DIGEST", "CONTAINER_IMAGE", "DOCKER_IMAGE")
SCHEDULER_VARIABLES = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_NNODES",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "KUBERNETES_SERVICE_HOST",
)
_SECRET_VALUE_PATTERNS = [
    re.compile(r"^(bearer|basic|token)\s+\S+", re.IGNORECASE),
    re.compile(r"eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]+"),  # JSON Web Token
    re.compile(
        r"\b(ghp|gho|ghu|ghs|github_pat|glpat|xox[abpr]|sk|sk-ant|hf|AKIA|AIza)[-_]?"
        r"[A-Za-z0-9_\-]{16,}"
    ),
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
]
_URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.\-]*://)(?P<user>[^:/@\s]+):[^@/\s]+@", re.IGNORECASE
)
_LONG_WORD = re.compile(r"^[A-Za-z0-9_\-+=.]{32,}$")


def is_secret_name(name: str) -> bool:
    """HF_TOKEN, WANDB_API_KEY, DB_PASSWORD, OAUTH_X, SSH_KEYS... but not TOKENIZERS_PARALLELISM:
    a word of the name must be, or end with, a secret word (plural allowed)."""
    words = re.split(r"[_\-.]", name.upper())
    return any(
        word.endswith(secret) or word.rstrip("S").endswith(secret)
        for word in words
        if word
        for secret in SECRET_NAME_PARTS
    )


def looks_like_secret(value: str) -> bool:
    """Bearer/basic credentials, JWTs, well-known API key shapes, long mixed random strings."""
    if any(pattern.search(value) for pattern in _SECRET_VALUE_PATTERNS):
        return True
    if _LONG_WORD.match(value) and not value.lower().startswith("sha256"):
        # Random keys mix upper, lower and digits; hashes (hex) and paths do not.
        return bool(
            re.search(r"[A-Z]", value) and re.search(r"[a-z]", value) and re.search(r"\d", value)
        )
    return False


def redact_value(name: str, value: str) -> str:
    if is_secret_name(name) or looks_like_secret(value):
        return REDACTED
    return _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", value)


def selected_environment(
    environ: Mapping[str, str], extra_prefixes: Iterable[str] = ()
) -> dict[str, str]:
    """The selected variables, with anything that looks secret replaced by '<redacted>'."""
    prefixes = SELECTED_ENV_PREFIXES + tuple(extra_prefixes)
    return {
        name: redact_value(name, value)
        for name, value in sorted(environ.items())
        if name.upper().startswith(prefixes)
    }


def installed_packages() -> dict[str, str]:
    packages: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"] if distribution.metadata else None
        if name:
            packages[name] = distribution.version
    return dict(sorted(packages.items(), key=lambda item: item[0].lower()))


def _git(arguments: list[str], cwd: str, timeout: float) -> str | None:
    try:
        completed = subprocess.run(
            ["git", *arguments],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() if completed.returncode == 0 else None


def git_state(cwd: str | None = None, timeout: float = 2.0) -> dict[str, Any]:
    """The commit of the repository around ``cwd`` and whether tracked files changed."""
    cwd = cwd or os.getcwd()
    commit = _git(["rev-parse", "HEAD"], cwd, timeout)
    if commit is None:
        return {"commit": None}
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd, timeout)
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def image_reference(environ: Mapping[str, str]) -> dict[str, Any]:
    for name in IMAGE_VARIABLES:
        if environ.get(name):
            value = environ[name]
            return {
                "reference": value,
                "variable": name,
                "pinned_by_digest": "@sha256:" in value or value.startswith("sha256:"),
            }
    return {"reference": None}


# Heartbeat field -> Slurm variable: what the console needs to act through the scheduler.
HEARTBEAT_SCHEDULER_FIELDS = (
    ("slurm_job_id", "SLURM_JOB_ID"),
    ("slurm_nodelist", "SLURM_JOB_NODELIST"),
    ("slurm_step_id", "SLURM_STEP_ID"),
)


def heartbeat_scheduler_fields(environ: Mapping[str, str]) -> dict[str, str]:
    """The Slurm context a heartbeat carries; empty outside Slurm (the body stays as it was)."""
    return {field: environ[name] for field, name in HEARTBEAT_SCHEDULER_FIELDS if environ.get(name)}


def scheduler_context(environ: Mapping[str, str], rank: int, node: str) -> dict[str, Any]:
    context: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "node": node,
        "rank": rank,
        "pid": os.getpid(),
    }
    context.update({name: environ[name] for name in SCHEDULER_VARIABLES if name in environ})
    return context


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def resource_limits(scratch_dir: str | None = None) -> dict[str, Any]:
    """Limits the sandbox grading looks at: CPUs, cgroup memory/CPU, shared memory, scratch."""
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    limits: dict[str, Any] = {
        "cpus": cpus,
        "cgroup_cpu_max": _read_text("/sys/fs/cgroup/cpu.max"),
        "cgroup_memory_max": _read_text("/sys/fs/cgroup/memory.max"),
        "shm_total_bytes": shutil.disk_usage("/dev/shm").total
        if Path("/dev/shm").exists()
        else None,
        "scratch_free_bytes": _free_bytes(scratch_dir or os.getcwd()),
    }
    torch = _fully_imported("torch")
    if torch is not None and torch.cuda.is_available():
        limits["accelerators"] = [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_bytes": torch.cuda.get_device_properties(i).total_memory,
            }
            for i in range(torch.cuda.device_count())
        ]
    return limits


def _fully_imported(name: str) -> Any:
    """The module if its import has finished, else None. The snapshot thread runs while the
    training thread may still be importing torch (``import torch`` after ``brakeline.init``):
    touching a half-initialised module raises "partially initialized module"."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if module is None or getattr(spec, "_initializing", False):
        return None
    return module


def _interpreter() -> dict[str, str]:
    """The Python that runs the training."""
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
    }


def _operating_system() -> dict[str, str]:
    """The operating system and machine it runs on."""
    return {
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
    }


def take_snapshot(
    *,
    rank: int = 0,
    node: str = "",
    seeds: Mapping[str, Any] | None = None,
    data_position: Mapping[str, Any] | None = None,
    scratch_dir: str | None = None,
    environ: Mapping[str, str] | None = None,
    extra_env_prefixes: Iterable[str] = (),
    loader: Any = None,
    checkpoint_holds: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the console shows and diffs for one moment of a run. ``loader`` (its
    workers) and ``checkpoint_holds`` (what a checkpoint saves: seeds, data-loader state) feed
    the sandbox section the console grades readiness from."""
    environ = os.environ if environ is None else environ
    return {
        "schema": 1,
        "taken_at": datetime.datetime.now(datetime.UTC).isoformat(),
        "sdk": {"name": "brakeline", "version": __version__},
        "python": _interpreter(),
        "platform": _operating_system(),
        "packages": installed_packages(),
        "environment": selected_environment(environ, extra_env_prefixes),
        "seeds": dict(seeds or {}),
        "git": git_state(),
        "image": image_reference(environ),
        "scheduler": scheduler_context(environ, rank, node),
        "resources": resource_limits(scratch_dir),
        "data_position": dict(data_position) if data_position is not None else None,
        "hardware": _guarded(hardware),
        "sandbox": _guarded(lambda: sandbox_facts(environ, loader, checkpoint_holds)),
    }


def _guarded(probe: Any) -> dict[str, Any]:
    try:
        return probe()
    except Exception as error:  # a probe must never fail the snapshot, let alone the run
        return {"error": f"{type(error).__name__}: {error}"}


def checkpoint_contents(training: Any, custom_saver: bool, kind: str = "") -> dict[str, Any]:
    """What this run's checkpoints save, as far as the SDK knows: the default saver writes the
    seeds and, with a wrapped loader, its position; a saver of your own is yours to say
    (``None``: unknown). ``at`` is the snapshot's kind: at start, seeds and a loader are
    usually registered a moment later, so the console grades them from the first checkpoint."""
    if custom_saver:
        return {"saver": "custom", "seeds": None, "data_loader_state": None, "at": kind}
    return {
        "saver": "brakeline",
        "seeds": bool(getattr(training, "seeds", None)),
        "data_loader_state": getattr(training, "loader", None) is not None,
        "at": kind,
    }


def send_resume_snapshot(
    run: Any, checkpoint: Any, step: int | None = None, data_position: Any = None
) -> None:
    """After a run resumed from ``checkpoint`` (a CheckpointResult or a path: after
    ``brakeline.restore`` in a new process, or at the end of a pause), send a ``resume``
    snapshot naming it. The console diffs it against that checkpoint's snapshot and raises an
    L1 when packages, seeds, the image or the data-loader state differ."""
    loader = getattr(getattr(run, "training", None), "loader", None)
    # Right after restore() the loader holds the saved position until its next loop replays
    # it: that pending position is the one the run resumes at.
    pending = getattr(loader, "_resume", None)
    if data_position is None and isinstance(pending, dict):
        data_position = {key: value for key, value in pending.items() if key != "epoch_start_rng"}
    elif data_position is None and loader is not None and hasattr(loader, "position"):
        data_position = loader.position()
    run.send_snapshot("resume", run.step if step is None else step, data_position, checkpoint)


def checkpoint_reference(checkpoint: Any) -> dict[str, Any]:
    """The ``checkpoint`` object of a checkpoint snapshot: path, sha256, bytes. From a
    CheckpointResult as it is, from a path by hashing it (run this off the training thread)."""
    from brakeline._checkpoint import sha256_of, size_of

    if hasattr(checkpoint, "sha256"):
        return {"path": checkpoint.path, "sha256": checkpoint.sha256, "bytes": checkpoint.bytes}
    path = Path(checkpoint).resolve()
    return {"path": str(path), "sha256": sha256_of(path), "bytes": size_of(path)}
