"""The difference between two environment snapshots, grouped the way a person reads it.

Pure Python over the stored documents (no Django): the console's diff page, its API and the
resume check (``breakers.snapshots.resume``) all call :func:`diff_snapshots`.

Groups: packages, environment variables, seeds, git, container image, data-loader position,
hardware, scheduler context, runtime (Python and platform). Each group lists ``changes``:
``{"key", "change": "added" | "removed" | "changed", "before", "after"}``. Secrets stay
redacted: the agent sent ``<redacted>``, so a redacted value is never shown in clear, and a
secret that changed behind its redaction cannot be seen (the row says so instead of
claiming "unchanged").

A missing section is not a difference: an older agent that does not record the hardware says
nothing about it, so the group is ``unknown`` rather than full of "removed".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

REDACTED_MARKERS = frozenset({"<redacted>", "[redacted]", "redacted", "***", "********"})
# What a resume must carry over unchanged for its metrics to match the run before it.
RESUME_CRITICAL_GROUPS = ("packages", "seeds", "image", "data_position")
# Scheduler fields that differ on every process: a resume in a new process is not a change.
_VOLATILE_SCHEDULER_KEYS = frozenset({"pid"})


@dataclass(frozen=True)
class Change:
    key: str
    change: str  # added | removed | changed | hidden
    before: Any = None
    after: Any = None

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "change": self.change, "before": self.before, "after": self.after}


@dataclass(frozen=True)
class Group:
    name: str
    title: str
    known: bool  # both snapshots carry this section
    changes: tuple[Change, ...] = ()

    @property
    def changed(self) -> bool:
        return any(change.change != "hidden" for change in self.changes)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "known": self.known,
            "changed": self.changed,
            "changes": [change.as_dict() for change in self.changes],
        }


@dataclass(frozen=True)
class SnapshotDiff:
    groups: tuple[Group, ...] = field(default_factory=tuple)

    def group(self, name: str) -> Group:
        return next(group for group in self.groups if group.name == name)

    @property
    def changed_groups(self) -> list[str]:
        return [group.name for group in self.groups if group.changed]

    @property
    def resume_critical(self) -> list[str]:
        """The groups whose change makes a resumed run's metrics differ."""
        return [name for name in RESUME_CRITICAL_GROUPS if self.group(name).changed]

    def as_dict(self) -> dict[str, Any]:
        return {
            "changed_groups": self.changed_groups,
            "resume_critical": self.resume_critical,
            "groups": [group.as_dict() for group in self.groups],
        }


def _is_redacted(value: Any) -> bool:
    return isinstance(value, str) and value in REDACTED_MARKERS


def diff_mappings(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[Change, ...]:
    """added / removed / changed keys, sorted by key (case-insensitively)."""
    changes = []
    for key in sorted(set(before) | set(after), key=lambda name: (name.lower(), name)):
        if key not in before:
            changes.append(Change(key, "added", None, after[key]))
        elif key not in after:
            changes.append(Change(key, "removed", before[key], None))
        elif before[key] != after[key]:
            changes.append(Change(key, "changed", before[key], after[key]))
        elif _is_redacted(before[key]):
            # Both "<redacted>": equal as sent, but the secrets behind may differ.
            changes.append(Change(key, "hidden", before[key], after[key]))
    return tuple(changes)


def _section(snapshot: Mapping[str, Any], name: str) -> Any:
    return snapshot.get(name) if isinstance(snapshot, Mapping) else None


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested objects as dotted keys (lists stay values): {"a": {"b": 1}} -> {"a.b": 1}."""
    if not isinstance(value, Mapping):
        return {prefix or "value": value}
    flat: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(item, Mapping) and item:
            flat.update(_flat(item, name))
        else:
            flat[name] = item
    return flat


def _image(snapshot: Mapping[str, Any]) -> dict[str, Any] | None:
    image = _section(snapshot, "image")
    if not isinstance(image, Mapping):
        return None
    reference = image.get("reference")
    digest = None
    if isinstance(reference, str) and "sha256:" in reference:
        digest = "sha256:" + reference.split("sha256:", 1)[1]
    return {"reference": reference, "digest": digest}


def accelerators_seen(snapshot: Mapping[str, Any]) -> list[Any]:
    """The names of the accelerators the snapshot's process saw on its host, one per device."""
    hardware = _section(snapshot, "hardware")
    resources = _section(snapshot, "resources")
    accelerators = hardware.get("accelerators") if isinstance(hardware, Mapping) else None
    if not accelerators and isinstance(resources, Mapping):
        accelerators = resources.get("accelerators")
    if not isinstance(accelerators, list):
        return []
    return [item.get("name") for item in accelerators if isinstance(item, Mapping)]


def _hardware(snapshot: Mapping[str, Any]) -> dict[str, Any] | None:
    hardware = _section(snapshot, "hardware")
    if not isinstance(hardware, Mapping):
        return None
    names = accelerators_seen(snapshot)
    return {
        "accelerators": ", ".join(f"{names.count(n)}× {n}" for n in dict.fromkeys(names)) or None,
        "nvidia_driver": hardware.get("nvidia_driver"),
        "cuda": hardware.get("cuda"),
        "cudnn": hardware.get("cudnn"),
        "cpu_model": hardware.get("cpu_model"),
    }


def _scheduler(snapshot: Mapping[str, Any]) -> dict[str, Any] | None:
    scheduler = _section(snapshot, "scheduler")
    if not isinstance(scheduler, Mapping):
        return None
    return {k: v for k, v in scheduler.items() if k not in _VOLATILE_SCHEDULER_KEYS}


def _runtime(snapshot: Mapping[str, Any]) -> dict[str, Any] | None:
    python, system = _section(snapshot, "python"), _section(snapshot, "platform")
    if not isinstance(python, Mapping) and not isinstance(system, Mapping):
        return None
    return _flat({"python": python or {}, "platform": system or {}})


def _data_position(snapshot: Mapping[str, Any]) -> dict[str, Any] | None:
    position = _section(snapshot, "data_position")
    if "data_position" not in snapshot:
        return None
    return _flat(position) if isinstance(position, Mapping) else {"position": None}


def _mapping(name: str) -> Callable[[Mapping[str, Any]], Any]:
    def read(snapshot: Mapping[str, Any]) -> Any:
        value = _section(snapshot, name)
        return _flat(value) if isinstance(value, Mapping) else None

    return read


# (name, title, how to read the section as a flat mapping; None when the snapshot lacks it)
GROUPS: tuple[tuple[str, str, Callable[[Mapping[str, Any]], Any]], ...] = (
    ("packages", "Packages", lambda s: _section(s, "packages")),
    ("environment", "Environment variables", lambda s: _section(s, "environment")),
    ("seeds", "Seeds", _mapping("seeds")),
    ("git", "Git", _mapping("git")),
    ("image", "Container image", _image),
    ("data_position", "Data-loader position", _data_position),
    ("hardware", "Hardware", _hardware),
    ("scheduler", "Scheduler context", _scheduler),
    ("runtime", "Python and platform", _runtime),
)


def diff_snapshots(before: Mapping[str, Any], after: Mapping[str, Any]) -> SnapshotDiff:
    """Every group of the two snapshot documents, changed or not."""
    groups = []
    for name, title, read in GROUPS:
        left, right = read(before), read(after)
        if not isinstance(left, Mapping) or not isinstance(right, Mapping):
            groups.append(Group(name, title, known=False))
            continue
        groups.append(Group(name, title, known=True, changes=diff_mappings(left, right)))
    return SnapshotDiff(tuple(groups))


def describe_resume_change(diff: SnapshotDiff, limit: int = 3) -> str:
    """ "packages (torch 2.12.0 → 2.13.0, +1 more), seeds (python 1 → 2)": the alert's words."""
    parts = []
    for name in diff.resume_critical:
        changes = [c for c in diff.group(name).changes if c.change != "hidden"]
        shown = ", ".join(_one(change) for change in changes[:limit])
        more = f", +{len(changes) - limit} more" if len(changes) > limit else ""
        parts.append(f"{name.replace('_', ' ')} ({shown}{more})")
    return "; ".join(parts)


def _one(change: Change) -> str:
    if change.change == "added":
        return f"+{change.key} {change.after}"
    if change.change == "removed":
        return f"-{change.key} {change.before}"
    return f"{change.key} {change.before} → {change.after}"
