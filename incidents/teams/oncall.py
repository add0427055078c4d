"""On-call rotations and shifts per team, and who is on call at a given moment.

Notifications page ``who_is_on_call(team)`` first: the shifts covering the moment (one-off
overrides, "I take Tuesday night"), then each rotation's person (incidents.teams.rotation,
the pure rule). A rotation or a shift grants no authority: the
person's role does, and only someone whose role lets them acknowledge alerts can hold a shift
(paging a person who may not act on the page would only lose time).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from core.errors import Conflict, InvalidInput, NotFound
from incidents.models import Membership, OnCallRotation, OnCallShift, Team
from incidents.teams import rotation
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import Attempt, AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User

# How many of a team's coming shifts "who is on call next" considers.
UPCOMING_SHIFTS = 200


def _team_id(team: Team | int) -> int:
    return team.pk if isinstance(team, Team) else int(team)


def rotation_spec(row: OnCallRotation) -> rotation.Rotation:
    people, zone = tuple(int(p) for p in row.people), row.time_zone
    return rotation.Rotation(people, row.length_days, row.handoff_time, zone, row.starts_on)


def _rotations(team_id: int) -> list[rotation.Rotation]:
    return [rotation_spec(row) for row in OnCallRotation.objects.filter(team_id=team_id)]


def _overrides(shifts: QuerySet, limit: int | None = None) -> list[rotation.Override]:
    rows = shifts.order_by("-starts_at", "-id").values_list("user_id", "starts_at", "ends_at")
    return [rotation.Override(*row) for row in (rows[:limit] if limit else rows)]


def _able(team_id: int, ids: list[int]) -> list[Any]:
    """The people of ``ids`` (in order) still members able to acknowledge alerts: a shift or a
    rotation outlives a role change, the authority does not."""
    roles = dict(Membership.objects.filter(team_id=team_id).values_list("user_id", "role"))
    able = [i for i in ids if decide(roles.get(i), Action.ACKNOWLEDGE_ALERT).allowed]
    users = get_user_model().objects.in_bulk(able)
    return [users[i] for i in able if i in users]


def who_is_on_call(team: Team | int, at: datetime | None = None) -> list[Any]:
    """The people on call for ``team`` at ``at`` (now by default): its shifts covering ``at``
    (the latest-starting first: an override), then each rotation's person
    (incidents.teams.rotation, the one rule)."""
    at, team_id = at or timezone.now(), _team_id(team)
    shifts = OnCallShift.objects.filter(team_id=team_id, starts_at__lte=at, ends_at__gt=at)
    ids = rotation.on_call_at(_rotations(team_id), _overrides(shifts), at)
    return _able(team_id, ids)


@dataclass(frozen=True)
class OnCallSummary:
    now: list[Any]
    next: list[Any]
    next_at: datetime | None


def on_call_summary(team: Team | int, at: datetime | None = None) -> OnCallSummary:
    """Who is on call now, and who next from when (the dashboard's line)."""
    at, team_id = at or timezone.now(), _team_id(team)
    rotations = _rotations(team_id)
    shifts = OnCallShift.objects.filter(team_id=team_id, ends_at__gt=at)
    overrides = _overrides(shifts, UPCOMING_SHIFTS)
    handover = rotation.next_on_call(rotations, overrides, at)
    current = _able(team_id, rotation.on_call_at(rotations, overrides, at))
    if handover is None:
        return OnCallSummary(current, [], None)
    return OnCallSummary(current, _able(team_id, handover.people), handover.at)


def _managed_team(user: User, team_id: int, attempt: Attempt) -> Team:
    """The team whose shifts and rotations ``user`` arranges (404 / 403 otherwise)."""
    team = scoped_get(Team.objects, user, team_id, team_path="id", noun="team", attempt=attempt)
    attempt.check(decide(role_in_team(user, team.pk), Action.MANAGE_SHIFTS))
    return team


def team_shifts(team: Team | int, *, ending_after: datetime | None = None) -> QuerySet:
    """The team's shifts that end after ``ending_after`` (all of them when None)."""
    shifts = OnCallShift.objects.filter(team_id=_team_id(team)).select_related("user")
    if ending_after is not None:
        shifts = shifts.filter(ends_at__gt=ending_after)
    return shifts.order_by("starts_at", "id")


def create_shift(
    user: User,
    team_id: int,
    *,
    person_id: int,
    starts_at: datetime,
    ends_at: datetime,
    context: AuditContext | None = None,
) -> OnCallShift:
    """Put ``person_id`` on call for the team from ``starts_at`` to ``ends_at``."""
    with audited(user, Action.MANAGE_SHIFTS, "team", team_id, context) as attempt:
        team = _managed_team(user, team_id, attempt)
        if ends_at <= starts_at:
            raise InvalidInput(
                "A shift must end after it starts.", fields={"ends_at": "must be after starts_at"}
            )
        person = get_user_model().objects.filter(pk=person_id).first()
        person_role = role_in_team(person, team.pk) if person is not None else None
        if person is None or person_role is None:
            raise InvalidInput(
                f"User {person_id} is not a member of team {team.name!r}.",
                fields={"user_id": "must be a member of the team"},
            )
        may_act = decide(person_role, Action.ACKNOWLEDGE_ALERT)
        if not may_act.allowed:
            raise InvalidInput(
                f"{person} cannot be on call: {may_act.reason}",
                fields={"user_id": "must be able to acknowledge alerts (on-call or above)"},
            )
        with transaction.atomic():
            shift = OnCallShift.objects.create(
                team=team, user=person, starts_at=starts_at, ends_at=ends_at, created_by=user
            )
            attempt.succeeded(f"shift #{shift.pk}: {person} from {starts_at} to {ends_at}")
    return shift


def delete_shift(
    user: User, team_id: int, shift_id: int, *, context: AuditContext | None = None
) -> None:
    """Remove a shift (plans change; the audit trail keeps who removed what)."""
    with audited(user, Action.MANAGE_SHIFTS, "shift", shift_id, context) as attempt:
        team = _managed_team(user, team_id, attempt)
        with transaction.atomic():
            shift = OnCallShift.objects.filter(pk=shift_id, team=team).first()
            if shift is None:
                raise NotFound(f"Team {team.name!r} has no shift {shift_id}.")
            description = str(shift)
            shift.delete()
            attempt.succeeded(f"shift #{shift_id} removed: {description}")


ROTATION_MAX_PEOPLE = 50
ROTATION_MAX_DAYS = 366


def _rotation_fields(
    name: str, people: list[int], length_days: int, time_zone: str
) -> dict[str, Any]:
    if not name.strip() or len(name.strip()) > 100:
        raise InvalidInput("A rotation needs a name.", fields={"name": "1 to 100 characters"})
    if not people or len(people) > ROTATION_MAX_PEOPLE:
        raise InvalidInput(
            "A rotation needs people.", fields={"people": f"1 to {ROTATION_MAX_PEOPLE} members"}
        )
    if not 1 <= length_days <= ROTATION_MAX_DAYS:
        raise InvalidInput(
            "A turn lasts 1 to 366 days.", fields={"length_days": "1 to 366 (7: weekly)"}
        )
    try:
        rotation.check_zone(time_zone)
    except ValueError as error:
        raise InvalidInput(str(error), fields={"time_zone": "an IANA time zone"}) from None
    return {"name": name.strip(), "people": list(people), "length_days": length_days}


def _check_people(team: Team, people: list[int]) -> None:
    roles = dict(Membership.objects.filter(team=team).values_list("user_id", "role"))
    for person_id in people:
        if not decide(roles.get(person_id), Action.ACKNOWLEDGE_ALERT).allowed:
            raise InvalidInput(
                f"User {person_id} cannot be on call for team {team.name!r}.",
                fields={"people": "members able to acknowledge alerts (on-call or above)"},
            )


def create_rotation(
    user: User,
    team_id: int,
    *,
    name: str,
    people: list[int],
    length_days: int,
    handoff_time: time,
    time_zone: str,
    starts_on: date,
    context: AuditContext | None = None,
) -> OnCallRotation:
    """People taking the pager in turn (incidents.teams.rotation)."""
    with audited(user, Action.MANAGE_SHIFTS, "team", team_id, context) as attempt:
        team = _managed_team(user, team_id, attempt)
        fields = _rotation_fields(name, people, length_days, time_zone)
        _check_people(team, people)
        if OnCallRotation.objects.filter(team=team, name=fields["name"]).exists():
            raise Conflict(f"Team {team.name!r} has a rotation {fields['name']!r} already.")
        with transaction.atomic():
            row = OnCallRotation.objects.create(
                team=team,
                handoff_time=handoff_time,
                time_zone=time_zone,
                starts_on=starts_on,
                created_by=user,
                **fields,
            )
            attempt.succeeded(f"rotation #{row.pk} {row.name!r}: {len(people)} people")
    return row


def delete_rotation(
    user: User, team_id: int, rotation_id: int, *, context: AuditContext | None = None
) -> None:
    with audited(user, Action.MANAGE_SHIFTS, "rotation", rotation_id, context) as attempt:
        team = _managed_team(user, team_id, attempt)
        with transaction.atomic():
            deleted, _ = OnCallRotation.objects.filter(pk=rotation_id, team=team).delete()
            if not deleted:
                raise NotFound(f"Team {team.name!r} has no rotation {rotation_id}.")
            attempt.succeeded(f"rotation #{rotation_id} removed")
