"""A person's standing in a team, and team scoping: what they can see at all.

Scoping comes before authority: an object of a team where the person may not even ``view``
is answered with 404, exactly as one that does not exist, so ids of other teams never leak.
Within their teams, ``incidents.teams.authority.decide`` answers (403 with its reason when refused).
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import models

from core.errors import NotFound
from incidents.models import Membership
from incidents.teams.audit import Attempt
from incidents.teams.authority import Action, decide
from incidents.teams.users import Visitor

M = TypeVar("M", bound=models.Model)


def role_in_team(user: Visitor, team_id: int) -> str | None:
    """The user's role in the team, or None when they have none (or are not logged in)."""
    if user is None or not user.is_authenticated:
        return None
    return (
        Membership.objects.filter(user=user, team_id=team_id).values_list("role", flat=True).first()
    )


def visible_team_ids(user: Visitor) -> list[int]:
    """Teams whose objects the user may see: those where the authority lets their role view."""
    if user is None or not user.is_authenticated:
        return []
    memberships = Membership.objects.filter(user=user).values_list("team_id", "role")
    return [team_id for team_id, role in memberships if decide(role, Action.VIEW).allowed]


def scoped_get(
    queryset: models.QuerySet[M] | models.Manager[M],
    user: Visitor,
    pk: Any,
    *,
    team_path: str,
    noun: str,
    attempt: Attempt | None = None,
) -> M:
    """The object with ``pk`` if the user's teams may see it, else NotFound.

    ``team_path`` is the lookup from the model to its team id (``"team_id"``, ``"job__team_id"``).
    With an ``attempt``, its team and the authority's reason are filled in, so an audit row of a
    refused probe still tells the owning team's admins who knocked (the requester learns
    nothing: the answer is the same 404 as for an id that does not exist).
    """
    found = queryset.filter(pk=pk, **{f"{team_path}__in": visible_team_ids(user)}).first()
    if found is not None:
        if attempt is not None:
            attempt.team_id = _team_id_of(found, team_path)
        return found
    if attempt is not None:
        owner = (
            queryset.model._default_manager.filter(pk=pk).values_list(team_path, flat=True).first()
        )
        attempt.team_id = owner
        if owner is not None:
            attempt.reason = _outsiders_reason(attempt.action)
    raise NotFound(f"There is no {noun} {pk}.")


def _outsiders_reason(action: str) -> str:
    """Why someone with no role in the owning team was refused, for its admins' audit trail.
    An audited verb that is no action of the authority's own (asking a manager to confirm a
    pause is allowed to whoever may pause) is refused for the same missing membership."""
    try:
        return decide(None, action).reason
    except ValueError:
        return "You have no role in this team."


def _team_id_of(obj: models.Model, team_path: str) -> int:
    value: Any = obj
    for part in team_path.split("__"):
        value = getattr(value, part)
    return value
