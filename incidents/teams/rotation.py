"""Who is on call at an instant: rotations and one-off overrides, as a pure core (no Django).

A rotation hands the pager from one person to the next every ``length_days`` days (7: weekly)
at a wall-clock ``handoff`` time in an IANA time zone, starting with the first person at the
hand-off of ``starts_on``. Hand-offs follow the zone's clock: across a daylight-saving change
a weekly turn lasts 167 or 169 hours, and a hand-off at a wall-clock time the change skips
(02:30 on a spring-forward night) happens at the same offset as before it (03:30 new time).

An override ("I take Tuesday night") puts a person on call from ``starts_at`` to ``ends_at``
(end exclusive) ahead of every rotation; overlapping overrides put the latest-starting first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

# How far "next on call" looks for a change of person before it gives up.
MAX_LOOKAHEAD_CHANGES = 64


@dataclass(frozen=True)
class Rotation:
    people: tuple[int, ...]  # in turn order; a person may appear more than once
    length_days: int
    handoff: time
    zone: str
    starts_on: date


@dataclass(frozen=True)
class Override:
    person: int
    starts_at: datetime
    ends_at: datetime


def check_zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; ValueError when there is no such zone."""
    if not name or name not in available_timezones():
        raise ValueError(f"{name!r} is not an IANA time zone (e.g. Europe/Paris, UTC)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{name!r} is not an IANA time zone") from None


def handoff_at(rotation: Rotation, turn: int) -> datetime:
    """The UTC instant at which turn number ``turn`` (0: the first person's) begins."""
    day = rotation.starts_on + timedelta(days=turn * rotation.length_days)
    local = datetime.combine(day, rotation.handoff, tzinfo=ZoneInfo(rotation.zone))
    # A skipped wall-clock time (fold 0) maps through the offset in force before the change.
    return local.astimezone(UTC)


def turn_at(rotation: Rotation, at: datetime) -> int | None:
    """The turn in force at ``at``; None before the first hand-off or for an empty rotation."""
    if not rotation.people or rotation.length_days < 1 or at < handoff_at(rotation, 0):
        return None
    first = datetime.combine(rotation.starts_on, rotation.handoff, tzinfo=UTC)
    naive_days = (at.astimezone(ZoneInfo(rotation.zone)).replace(tzinfo=UTC) - first).days
    turn = max(0, naive_days // rotation.length_days)
    while turn > 0 and handoff_at(rotation, turn) > at:
        turn -= 1
    while handoff_at(rotation, turn + 1) <= at:
        turn += 1
    return turn


def rotation_person(rotation: Rotation, at: datetime) -> int | None:
    turn = turn_at(rotation, at)
    return None if turn is None else rotation.people[turn % len(rotation.people)]


def on_call_at(
    rotations: Sequence[Rotation], overrides: Sequence[Override], at: datetime
) -> list[int]:
    """Who is on call at ``at``: the overrides covering it (latest start first), then each
    rotation's person in the rotations' order; each person once."""
    covering = [o for o in overrides if o.starts_at <= at < o.ends_at]
    covering.sort(key=lambda o: o.starts_at, reverse=True)
    people = [o.person for o in covering]
    people += [p for p in (rotation_person(r, at) for r in rotations) if p is not None]
    return list(dict.fromkeys(people))


def next_change(
    rotations: Sequence[Rotation], overrides: Sequence[Override], after: datetime
) -> datetime | None:
    """The first instant after ``after`` at which a hand-off or an override begins or ends."""
    moments = [t for o in overrides for t in (o.starts_at, o.ends_at) if t > after]
    for rotation in rotations:
        turn = turn_at(rotation, after)
        if rotation.people and rotation.length_days >= 1:
            moments.append(handoff_at(rotation, 0 if turn is None else turn + 1))
    later = [m for m in moments if m > after]
    return min(later) if later else None


@dataclass(frozen=True)
class Handover:
    people: list[int]
    at: datetime


def next_on_call(
    rotations: Sequence[Rotation], overrides: Sequence[Override], now: datetime
) -> Handover | None:
    """When the people on call next differ from now's, and who they are then."""
    current = on_call_at(rotations, overrides, now)
    moment = now
    for _ in range(MAX_LOOKAHEAD_CHANGES):
        following = next_change(rotations, overrides, moment)
        if following is None:
            return None
        people = on_call_at(rotations, overrides, following)
        if people != current:
            return Handover(people, following)
        moment = following
    return None
