"""What an action may touch: the one seam every executor takes its target from.

**Agents report; they never designate.** A heartbeat, a point, a checkpoint report or a
replica heartbeat says what the job *claims* (a pid, a host, a backend and server, a path).
An executor acts only on what the console itself knows is the job's, learnt through a
trusted path:

- a local process: registered from this host, its start time and the job's token proven
  (``local_process``);
- a restarted process: runs as the replaced process's own uid, gid and groups
  (``restart_identity``);
- a Slurm job: Slurm's own answer, ``--comment=brakeline:<job>`` (slurm ``verified_job``);
- a Slurm node: in the node list Slurm gives for that job (slurm ``_node_of_the_job``);
- a load balancer's server: declared for the job by a team admin (``traffic_server``);
- a checkpoint: under the job's or team's declared root (``checkpoint_location``);
- a node's hardware alerts: bound by Slurm's answer or an operator (``node_binding``); a node
  only the agent named pages people but is never isolated or terminated automatically.

Each executor registers here (``register``) with what it acts on and the check it uses;
``tests/security/test_executor_targets.py`` enumerates the registry (and every module of
``breakers/executors`` that sends a signal, starts a process or speaks to a scheduler or load
balancer) and proves each refuses a target that is not the job's.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from django.conf import settings

from breakers.executors.identity import identity_refusal
from breakers.executors.slurm.client import job_nodes
from breakers.models import (
    BindingSource,
    CheckpointRoot,
    InferenceServer,
    NodeBinding,
    SchedulerBinding,
)
from core.errors import InvalidInput
from incidents.models import Job

# --- The registry ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    name: str  # the executor's name ("local", "slurm", "haproxy", …)
    module: str  # where it acts (the test checks every acting module registers)
    acts_on: str  # what it touches, in words
    check: str  # the function of this module that decides the target


REGISTRY: dict[str, Registration] = {}


def register(name: str, module: str, *, acts_on: str, check: str) -> None:
    """An executor declares itself: it acts on ``acts_on``, decided by ``check`` here."""
    if check not in globals() and check not in EXTERNAL_CHECKS:
        raise ValueError(f"{check} is not a target check of breakers.executors.targets")
    REGISTRY[name] = Registration(name, module, acts_on, check)


# Checks that live beside the scheduler client they need (Slurm's own answer).
EXTERNAL_CHECKS = frozenset({"slurm.verified_job", "slurm.node_of_the_job"})


# --- Local processes ---------------------------------------------------------------------------


def local_process(job: Job, pid: int) -> str | None:
    """Why ``pid`` is not proven to be ``job``'s process on this host (None when it is)."""
    return identity_refusal(job, pid)


@dataclass(frozen=True)
class ProcessIdentity:
    uid: int
    gid: int
    groups: tuple[int, ...]


def process_identity(pid: int) -> ProcessIdentity | None:
    """The real uid, gid and supplementary groups of ``pid`` (/proc/PID/status)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    try:
        uid = int(fields["Uid"].split()[0])
        gid = int(fields["Gid"].split()[0])
        groups = tuple(int(g) for g in fields.get("Groups", "").split())
    except (KeyError, ValueError, IndexError):
        return None
    return ProcessIdentity(uid, gid, groups)


def restart_identity(pid: int) -> ProcessIdentity | str:
    """Who a restart of ``pid`` runs as: exactly the replaced process's uid, gid and groups —
    or why it may not run (this worker cannot take that identity, so it would run with more
    privilege or other rights than the process it replaces)."""
    identity = process_identity(pid)
    if identity is None:
        return f"the owner of process {pid} cannot be read"
    if os.geteuid() == 0:
        return identity  # root drops to the replaced process's identity before exec
    mine = ProcessIdentity(os.getuid(), os.getgid(), tuple(sorted(os.getgroups())))
    if (identity.uid, identity.gid) != (mine.uid, mine.gid):
        return (
            f"process {pid} runs as uid {identity.uid} gid {identity.gid}; this worker runs as "
            f"uid {mine.uid} gid {mine.gid} and cannot start it as its own user"
        )
    return identity


# --- Load balancer servers ---------------------------------------------------------------------


def traffic_server(job_id: int, backend: str, server: str) -> str | None:
    """Why ``backend/server`` is not the job's (None when a team admin declared it for it)."""
    declared = InferenceServer.objects.filter(backend=backend, server=server)
    owner = declared.values_list("job_id", flat=True).first()
    if owner == job_id:
        return None
    if owner is None:
        return f"{backend}/{server} is not declared as a server of this job"
    return f"{backend}/{server} is declared for another job"


# --- Checkpoints -------------------------------------------------------------------------------


def declared_root(job_id: int) -> str:
    """The job's checkpoint root: its own, else its team's, else the operator's default
    (``BRAKELINE_CHECKPOINT_ROOT``); "" when none is declared."""
    roots = CheckpointRoot.objects.filter(team__jobs__pk=job_id)
    own = roots.filter(job_id=job_id).values_list("root", flat=True).first()
    team = roots.filter(job__isnull=True).values_list("root", flat=True).first()
    return own or team or settings.CHECKPOINT_ROOT


def normalise_root(root: str) -> str:
    """A root as stored: an absolute folder without ``..`` (symlinks resolved), or
    ``scheme://bucket/prefix/`` for an object store the operator allows
    (``BRAKELINE_CHECKPOINT_SCHEMES``). ValueError saying why otherwise."""
    root = root.strip()
    if not _encodable(root):
        raise ValueError("holds characters no path can (a lone surrogate)")
    scheme = urlsplit(root).scheme if "://" in root else ""
    if scheme:
        if scheme not in settings.CHECKPOINT_SCHEMES:
            allowed = ", ".join(settings.CHECKPOINT_SCHEMES) or "none"
            raise ValueError(f"scheme {scheme}:// is not allowed here (allowed: {allowed})")
        rest = root.split("://", 1)[1]
        if not rest.strip("/") or ".." in rest.split("/"):
            raise ValueError("names no bucket, or holds '..'")
        return root if root.endswith("/") else root + "/"
    resolved = _resolved(root)
    if resolved is None:
        raise ValueError("must be an absolute path without '..'")
    return resolved


def under(path: str, root: str) -> bool:
    if "://" in root:
        return path.startswith(root)
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def _resolved(path: str) -> str | None:
    """The path as the console will name it: absolute, normalised, symlinks resolved (what
    exists of it on this host); None when it holds ``..`` or is relative."""
    if not path.startswith("/") or ".." in path.split("/"):
        return None
    try:
        return os.path.realpath(posixpath.normpath(path))
    except (ValueError, UnicodeError, OSError):  # a lone surrogate, a NUL: no such path
        return None


def checkpoint_location(job_id: int, path: str, field: str = "path") -> str:
    """The checkpoint's path, checked: under the job's declared root, no ``..``, symlinks
    resolved, no ``file://``, no scheme the root does not use, nothing under another team's
    root. InvalidInput naming ``field`` otherwise."""
    return checkpoint_locations(job_id, {field: path})[field]


def checkpoint_locations(job_id: int, paths: dict[str, str]) -> dict[str, str]:
    """``checkpoint_location`` for every ``{field: path}`` of one report (a set's thousand
    shards cost the same three queries as one file)."""
    root = declared_root(job_id)
    if not root:
        field = next(iter(paths), "path")
        raise InvalidInput(
            "No checkpoint root is declared for this job: a team admin declares one.",
            fields={field: "no checkpoint root is declared for this job or its team"},
        )
    others = _other_roots(job_id)
    checked: dict[str, str] = {}
    for field, path in paths.items():
        why = _location_refusal(job_id, path, root, others)
        if why is not None:
            raise InvalidInput(f"The checkpoint {field} was refused: {why}.", fields={field: why})
        checked[field] = path if "://" in path else (_resolved(path) or path)
    return checked


def _other_roots(job_id: int) -> list[str]:
    return list(
        CheckpointRoot.objects.exclude(team__jobs__pk=job_id).values_list("root", flat=True)
    )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeError:
        return False
    return "\x00" not in text


def _location_refusal(
    job_id: int, path: str, root: str, others: list[str] | None = None
) -> str | None:
    if not _encodable(path):
        return "holds characters no path can (a lone surrogate or NUL)"
    if "://" in path:
        scheme = urlsplit(path).scheme
        if "://" not in root or not path.startswith(root):
            return f"a {scheme}:// location outside the job's checkpoint root {root}"
        if ".." in path.split("://", 1)[1].split("/"):
            return "holds '..'"
        return None
    resolved = _resolved(path)
    if resolved is None:
        return "must be an absolute path without '..'"
    if not under(resolved, root):
        return f"{resolved} is not under the job's checkpoint root {root}"
    others = _other_roots(job_id) if others is None else others
    if any(under(resolved, other) and len(other) > len(root) for other in others):
        return f"{resolved} is under another team's checkpoint root"
    return None


def checkpoint_refusal(job_id: int, path: str) -> str | None:
    """Why a catalogued path is no longer the job's to roll back to (None when it is)."""
    root = declared_root(job_id)
    if not root:
        return "no checkpoint root is declared for this job"
    return _location_refusal(job_id, path, root)


def checkpoints_in_root(job_id: int, paths: list[str]) -> set[str]:
    """Which of ``paths`` the job may roll back to now (three queries for any number)."""
    root = declared_root(job_id)
    if not root:
        return set()
    others = _other_roots(job_id)
    return {p for p in paths if _location_refusal(job_id, p, root, others) is None}


# --- Nodes -------------------------------------------------------------------------------------


def node_binding(job_id: int, hostname: str) -> str:
    """How ``hostname`` is known to be the job's: ``operator`` or ``scheduler`` (verified), or
    ``agent`` (only the job's agent said so: unverified)."""
    names = {hostname, hostname.split(".", 1)[0]}
    source = (
        NodeBinding.objects.filter(job_id=job_id, hostname__in=names)
        .values_list("source", flat=True)
        .first()
    )
    if source is not None:
        return str(source)
    if _slurm_confirms(job_id, names):
        return BindingSource.SCHEDULER
    return AGENT_REPORTED


AGENT_REPORTED = "agent"  # reported by the agent, unverified


def _slurm_confirms(job_id: int, names: set[str]) -> bool:
    """The job's Slurm binding (made only once Slurm confirmed the job) lists the node."""
    binding = SchedulerBinding.objects.filter(job_id=job_id, executor="slurm").first()
    if binding is None or not binding.slurm_nodelist:
        return False
    nodelist = binding.slurm_nodelist
    hosts = nodelist.split(",") if "[" not in nodelist else job_nodes(nodelist)[0]
    return bool(hosts) and bool(names & set(hosts or []))
