"""Sandbox readiness: can this job be paused and resumed (or restarted elsewhere) faithfully?

Graded from the job's latest environment snapshot (its ``sandbox``, ``image``, ``seeds``,
``resources`` and ``hardware`` sections, which the SDK collects), one item per concern, each
with the sentence that says why. Pure Python (no Django): the job page, the dashboard, the API
and the warning shown before a pause all call :func:`grade`.

Item statuses: ``ok``, ``warn`` (works, but a pause or a restart may not give the same run),
``fail`` (known to break it), ``unknown`` (the snapshot does not say), ``na`` (not applicable).
The job's grade is the worst status among the items: ``ready``, ``at risk``, ``not ready``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GiB = 1024**3
MiB = 1024**2
# PyTorch's loader workers hand batches over through /dev/shm; a few hundred MiB per worker is
# the usual working set of image batches. Docker's default of 64 MiB is the classic silent hang.
SHM_PER_WORKER_BYTES = 256 * MiB
SHM_MINIMUM_BYTES = 64 * MiB
SCRATCH_FAIL_BYTES = 1 * GiB
SCRATCH_WARN_BYTES = 10 * GiB
# NCCL, RDMA and pinned-memory loaders lock pages: 64 KiB or 8 MiB defaults fail them.
MEMLOCK_WANTED_BYTES = 1 * GiB
STACK_MINIMUM_BYTES = 8 * MiB
_ORDER = {"ok": 0, "na": 0, "unknown": 1, "warn": 2, "fail": 3}
GRADES = {0: "ready", 1: "ready", 2: "at risk", 3: "not ready"}
# What a pause relies on: items whose failure means a resume does not give back the same run.
PAUSE_ITEMS = ("image", "dependencies", "seeds", "loader_state", "shm")


@dataclass(frozen=True)
class Item:
    key: str
    title: str
    status: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "title": self.title, "status": self.status, "reason": self.reason}


@dataclass(frozen=True)
class Readiness:
    grade: str  # ready | at risk | not ready | unknown
    items: tuple[Item, ...]

    @property
    def counts(self) -> dict[str, int]:
        counts = {status: 0 for status in ("ok", "warn", "fail", "unknown", "na")}
        for item in self.items:
            counts[item.status] += 1
        return counts

    @property
    def pause_warnings(self) -> list[str]:
        """Sentences to show before anyone relies on pausing the job."""
        return [
            item.reason
            for item in self.items
            if item.key in PAUSE_ITEMS and item.status not in ("ok", "na")
        ]

    def as_dict(self) -> dict[str, Any]:
        return {
            "grade": self.grade,
            "counts": self.counts,
            "items": [item.as_dict() for item in self.items],
            "pause_warnings": self.pause_warnings,
        }


def size(value: float) -> str:
    """1073741824 -> "1 GiB", 67108864 -> "64 MiB"."""
    for unit, factor in (("TiB", 1024**4), ("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if value >= factor:
            number = value / factor
            return (
                f"{number:.0f} {unit}"
                if number >= 10 or number == int(number)
                else (f"{number:.1f} {unit}")
            )
    return f"{value:.0f} B"


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _image(snapshot: Mapping[str, Any], sandbox: Mapping[str, Any]) -> Item:
    image = _dict(snapshot.get("image"))
    reference = image.get("reference")
    container = _dict(sandbox.get("container"))
    title = "Image pinned by digest"
    if isinstance(reference, str) and reference:
        if image.get("pinned_by_digest") or "@sha256:" in reference:
            return Item("image", title, "ok", f"pinned: {reference}")
        return Item(
            "image",
            title,
            "fail",
            f"image {reference} is a tag, which can be "
            "re-pushed: a restart may get other software; pin it by digest (@sha256:…)",
        )
    if container.get("in_container") is False:
        return Item("image", title, "na", "not in a container")
    if container.get("in_container"):
        evidence = ", ".join(container.get("evidence") or []) or "the cgroup"
        return Item(
            "image",
            title,
            "warn",
            f"in a container ({evidence}) whose image is not "
            "recorded: set BRAKELINE_IMAGE to its digest reference",
        )
    return Item("image", title, "unknown", "the snapshot says nothing of a container")


def _dependencies(sandbox: Mapping[str, Any]) -> Item:
    title = "Dependencies baked in"
    if "late_installed_packages" not in sandbox:
        return Item("dependencies", title, "unknown", "the agent does not report installs")
    late = [p.get("name") for p in sandbox.get("late_installed_packages") or [] if p]
    installers = sandbox.get("installers_in_command") or []
    since = (
        "the container" if _dict(sandbox.get("container")).get("in_container") else "the process"
    )
    problems = []
    if installers:
        problems.append(f"the start-up command runs {' and '.join(installers)} install")
    count = sandbox.get("late_installed_count")
    count = count if isinstance(count, int) and count >= len(late) else len(late)
    if late:
        # The most recent first: the last install is the likeliest to matter.
        recent = [str(name) for name in reversed(late[-5:])]
        names = ", ".join(recent) + (" …" if count > len(recent) else "")
        problems.append(f"{count} package(s) installed after {since} started: {names}")
    if problems:
        return Item(
            "dependencies",
            title,
            "fail",
            "; ".join(problems) + " — a restart installs whatever the index serves then",
        )
    return Item("dependencies", title, "ok", f"nothing installed since {since} started")


def _seeds(snapshot: Mapping[str, Any], holds: Mapping[str, Any]) -> Item:
    title = "Seeds set and recorded"
    seeds = _dict(snapshot.get("seeds"))
    if not seeds and holds.get("at") == "start":
        return Item(
            "seeds",
            title,
            "unknown",
            "none recorded yet at start; graded again at the first checkpoint",
        )
    if not seeds:
        return Item("seeds", title, "fail", "no seed set (run.seed(n) sets and records them)")
    names = ", ".join(f"{name}={value}" for name, value in list(seeds.items())[:4])
    if holds.get("seeds"):
        return Item("seeds", title, "ok", f"{names}; saved in checkpoints")
    if holds.get("saver") == "custom":
        return Item(
            "seeds", title, "warn", f"{names}; a custom saver: are they in its checkpoints?"
        )
    return Item("seeds", title, "unknown", f"{names}; checkpoint contents not reported")


def _loader_state(holds: Mapping[str, Any]) -> Item:
    title = "Data-loader state in checkpoints"
    if holds.get("data_loader_state"):
        return Item(
            "loader_state", title, "ok", "the loader's position is saved with each checkpoint"
        )
    if holds.get("saver") == "custom":
        return Item(
            "loader_state",
            title,
            "warn",
            "a custom saver: the SDK cannot tell whether it saves the loader's position",
        )
    if holds.get("data_loader_state") is False and holds.get("at") == "start":
        return Item(
            "loader_state",
            title,
            "unknown",
            "no loader wrapped yet at start; graded again at the first checkpoint",
        )
    if holds.get("data_loader_state") is False:
        return Item(
            "loader_state",
            title,
            "fail",
            "no loader wrapped (run.wrap_loader): a resume "
            "starts the data over and sees other batches",
        )
    return Item("loader_state", title, "unknown", "checkpoint contents not reported")


def _cgroup(sandbox: Mapping[str, Any]) -> tuple[Item, Item]:
    cgroup = _dict(sandbox.get("cgroup"))
    if not cgroup:
        unknown = "the cgroup was not reported"
        return (
            Item("memory_limit", "Memory limit", "unknown", unknown),
            Item("cpu_limit", "CPU limit", "unknown", unknown),
        )
    version = f"cgroup v{cgroup.get('version')}" if cgroup.get("version") else "cgroup"
    memory, cpus = cgroup.get("memory_max_bytes"), cgroup.get("cpu_max_cpus")
    memory_item = (
        Item("memory_limit", "Memory limit", "ok", f"{size(memory)} ({version})")
        if memory
        else Item(
            "memory_limit",
            "Memory limit",
            "warn",
            f"no memory limit ({version}): "
            "a leak in this job takes memory from everything on the node",
        )
    )
    cpu_item = (
        Item("cpu_limit", "CPU limit", "ok", f"{cpus:g} CPUs ({version})")
        if cpus
        else Item(
            "cpu_limit",
            "CPU limit",
            "warn",
            f"no CPU limit ({version}): loader "
            "workers compete with every other process on the node",
        )
    )
    return memory_item, cpu_item


def _shm(sandbox: Mapping[str, Any]) -> Item:
    title = "/dev/shm size"
    total = _dict(sandbox.get("shm")).get("total_bytes")
    workers = sandbox.get("loader_workers")
    if not isinstance(total, (int, float)):
        return Item("shm", title, "unknown", "/dev/shm was not reported")
    if isinstance(workers, int) and workers > 0:
        needed = workers * SHM_PER_WORKER_BYTES
        if total < needed:
            return Item(
                "shm",
                title,
                "fail",
                f"/dev/shm is {size(total)}; {workers} loader workers "
                f"need about {size(needed)}: too small, the loader hangs silently",
            )
        return Item("shm", title, "ok", f"{size(total)} for {workers} loader workers")
    if total < SHM_MINIMUM_BYTES:
        return Item(
            "shm", title, "warn", f"/dev/shm is {size(total)}: too small for any loader worker"
        )
    return Item(
        "shm",
        title,
        "ok",
        f"{size(total)}" + ("" if workers is not None else " (loader workers unknown)"),
    )


def _scratch(snapshot: Mapping[str, Any]) -> Item:
    title = "Scratch disk"
    free = _dict(snapshot.get("resources")).get("scratch_free_bytes")
    if not isinstance(free, (int, float)):
        return Item("scratch", title, "unknown", "free space was not reported")
    if free < SCRATCH_FAIL_BYTES:
        return Item(
            "scratch", title, "fail", f"{size(free)} free where checkpoints go: a save fails"
        )
    if free < SCRATCH_WARN_BYTES:
        return Item("scratch", title, "warn", f"{size(free)} free where checkpoints go")
    return Item("scratch", title, "ok", f"{size(free)} free where checkpoints go")


def _ulimits(sandbox: Mapping[str, Any]) -> Item:
    title = "ulimits (memlock, stack)"
    limits = _dict(sandbox.get("ulimits"))
    if not limits:
        return Item("ulimits", title, "unknown", "ulimits were not reported")
    memlock = _dict(limits.get("memlock")).get("soft")
    stack = _dict(limits.get("stack")).get("soft")
    problems = []
    if memlock is not None and memlock < MEMLOCK_WANTED_BYTES:
        problems.append(f"memlock is {size(memlock)} (pinned memory and NCCL want unlimited)")
    if stack is not None and stack < STACK_MINIMUM_BYTES:
        problems.append(f"stack is {size(stack)}")
    shown = (
        f"memlock {'unlimited' if memlock is None else size(memlock)}, "
        f"stack {'unlimited' if stack is None else size(stack)}"
    )
    if problems:
        return Item("ulimits", title, "warn", "; ".join(problems))
    return Item("ulimits", title, "ok", shown)


def _accelerators(snapshot: Mapping[str, Any]) -> Item:
    title = "Accelerator memory"
    found = _dict(snapshot.get("hardware")).get("accelerators") or _dict(
        snapshot.get("resources")
    ).get("accelerators")
    if not found:
        return Item("accelerators", title, "na", "no accelerator visible to the process")
    shown = ", ".join(
        f"{item.get('name')} {size(item.get('memory_bytes') or 0)}"
        for item in found
        if isinstance(item, Mapping)
    )
    return Item("accelerators", title, "ok", shown)


def _stateless(item: Item) -> Item:
    return Item(item.key, item.title, "na", "an inference replica holds no state to resume")


def grade(snapshot: Mapping[str, Any] | None, kind: str = "training") -> Readiness:
    """The job's readiness from its latest snapshot document (None: no snapshot yet). An
    inference job's replicas are restarted, never resumed: seeds and loader state do not
    apply to them."""
    if not snapshot:
        return Readiness(
            "unknown",
            (Item("snapshot", "Snapshot", "unknown", "no environment snapshot received yet"),),
        )
    sandbox = _dict(snapshot.get("sandbox"))
    holds = _dict(sandbox.get("checkpoint_holds"))
    memory, cpu = _cgroup(sandbox)
    seeds, loader = _seeds(snapshot, holds), _loader_state(holds)
    if kind == "inference":
        seeds, loader = _stateless(seeds), _stateless(loader)
    items = (
        _image(snapshot, sandbox),
        _dependencies(sandbox),
        seeds,
        loader,
        memory,
        cpu,
        _shm(sandbox),
        _scratch(snapshot),
        _ulimits(sandbox),
        _accelerators(snapshot),
    )
    worst = max(_ORDER[item.status] for item in items)
    return Readiness(GRADES[worst], items)
