"""The launcher fields of a heartbeat: which process launched the reporting rank.

``launcher_pid``, ``launcher_pgid`` and ``launcher_start_time`` come together or not at all
(the SDK sends them under torchrun's elastic agent: its parent's pid, process group and
proc(5) start time). Parsed here so the heartbeat parser only lists the keys.
"""

from __future__ import annotations

from dataclasses import dataclass

LAUNCHER_KEYS = ("launcher_pid", "launcher_pgid", "launcher_start_time")
MAX_PID = 2**31 - 1
MAX_START_TIME = 2**62


@dataclass(frozen=True, slots=True)
class LauncherIn:
    pid: int
    pgid: int
    start_time: int


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def check_launcher(body: dict, errors: dict[str, str]) -> LauncherIn | None:
    """The launcher of a heartbeat body (None when it names none); problems go to ``errors``
    under each field's name."""
    given = [key for key in LAUNCHER_KEYS if body.get(key) is not None]
    if not given:
        return None
    for key in LAUNCHER_KEYS:
        if key not in given:
            errors[key] = (
                f"is required with {', '.join(given)}: the launcher's fields come together"
            )
    pid, pgid, start = (body.get(key) for key in LAUNCHER_KEYS)
    if "launcher_pid" in given and not _whole(pid, 2, MAX_PID):
        errors["launcher_pid"] = "must be a whole number from 2 (a launcher is never PID 1)"
    if "launcher_pgid" in given and not _whole(pgid, 1, MAX_PID):
        errors["launcher_pgid"] = "must be a positive whole number (a process group id)"
    if "launcher_start_time" in given and not _whole(start, 0, MAX_START_TIME):
        errors["launcher_start_time"] = "must be a whole number >= 0 (clock ticks after boot)"
    if any(key in errors for key in LAUNCHER_KEYS):
        return None
    assert isinstance(pid, int) and isinstance(pgid, int) and isinstance(start, int)
    return LauncherIn(pid=pid, pgid=pgid, start_time=start)
