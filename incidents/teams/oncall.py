"""On-call shifts per team, and who is on call at a given moment.

The notifications issue pages ``who_is_on_call(team)`` first. A shift grants no authority: the
person's role does, and only someone whose role lets them acknowledge alerts can hold a shift
(paging a person who may not act on the page would only lose time).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from core.errors import InvalidInput, NotFound
from incidents.models import Membership, OnCallShift, Team
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User


def _team_id(team: Team | int) -> int:
    return team.pk if isinstance(team, Team) else int(team)


def who_is_on_call(team: Team | int, at: datetime | None = None) -> list[Any]:
    """The people on call for ``team`` at ``at`` (now by default), most recent shift first.

    Only people who are still members able to acknowledge alerts count: a shift outlives a
    role change, the authority does not.
    """
    at = at or timezone.now()
    shifts = (
        OnCallShift.objects.filter(team_id=_team_id(team), starts_at__lte=at, ends_at__gt=at)
        .select_related("user")
        .order_by("-starts_at", "-id")
    )
    roles = dict(Membership.objects.filter(team_id=_team_id(team)).values_list("user_id", "role"))
    people, seen = [], set()
    for shift in shifts:
        role = roles.get(shift.user_id)
        if shift.user_id in seen or not decide(role, Action.ACKNOWLEDGE_ALERT).allowed:
            continue
        seen.add(shift.user_id)
        people.append(shift.user)
    return people


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
        team = scoped_get(Team.objects, user, team_id, team_path="id", noun="team", attempt=attempt)
        attempt.check(decide(role_in_team(user, team.pk), Action.MANAGE_SHIFTS))
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
        team = scoped_get(Team.objects, user, team_id, team_path="id", noun="team", attempt=attempt)
        attempt.check(decide(role_in_team(user, team.pk), Action.MANAGE_SHIFTS))
        with transaction.atomic():
            shift = OnCallShift.objects.filter(pk=shift_id, team=team).first()
            if shift is None:
                raise NotFound(f"Team {team.name!r} has no shift {shift_id}.")
            description = str(shift)
            shift.delete()
            attempt.succeeded(f"shift #{shift_id} removed: {description}")
