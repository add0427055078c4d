"""A team's members: adding a person to a team with a role (the ``add_member`` command and
the admin's front doors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction

from core.errors import InvalidInput
from incidents.models import (
    Membership,
    Role,
    Team,
)
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action


@dataclass(frozen=True)
class AddedMember:
    membership: Membership
    user_created: bool
    team_created: bool
    previous_role: str | None  # None: the user had no role in the team before


def add_member(
    team_name: str,
    username: str,
    role: str,
    *,
    password: str | None = None,
    context: AuditContext | None = None,
) -> AddedMember:
    """Give ``username`` the ``role`` in the team, replacing any role they had there.

    The team is created if new, and so is the user, which then needs a password (checked by
    AUTH_PASSWORD_VALIDATORS); an existing user's password is left alone. An operator's act at
    the server (``manage.py add_member``): audited as ``manage_members`` by the system.
    """
    team_name, username = team_name.strip(), username.strip()
    given = {"team": team_name, "user": username}
    errors = {key: "must not be empty" for key, value in given.items() if not value}
    if role not in Role.values:
        errors["role"] = f"must be one of {', '.join(Role.values)}"
    if errors:
        raise InvalidInput("The member cannot be added.", fields=errors)
    context = context or AuditContext(via="command")
    with audited(None, Action.MANAGE_MEMBERS, "team", None, context) as attempt:
        attempt.allowed, attempt.reason = True, "An operator at the server manages members."
        with transaction.atomic():
            user, user_created = _member_user(username, password)  # may refuse: no team yet
            team, team_created = Team.objects.get_or_create(name=team_name)
            attempt.team_id = attempt.target_id = team.pk
            previous = _role_of(user, team)
            membership, _ = Membership.objects.update_or_create(
                user=user, team=team, defaults={"role": role}
            )
            was = f" (was {previous})" if previous else ""
            attempt.succeeded(f"{username} is {role} of {team_name}{was}")
    return AddedMember(membership, user_created, team_created, previous)


def _role_of(user: Any, team: Team) -> str | None:
    return Membership.objects.filter(user=user, team=team).values_list("role", flat=True).first()


def _member_user(username: str, password: str | None) -> tuple[Any, bool]:
    """The user, created with ``password`` when there is none yet."""
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is not None:
        return user, False
    if not password:
        raise InvalidInput(
            f"There is no user {username!r}: a password is needed to create it.",
            fields={"password": "required for a new user"},
        )
    try:
        validate_password(password, User(username=username))
    except ValidationError as error:
        raise InvalidInput(
            "The password is refused.", fields={"password": " ".join(error.messages)}
        ) from None
    return User.objects.create_user(username, password=password), True
