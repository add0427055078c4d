"""manage.py add_member --team TEAM --user USERNAME --role viewer|oncall|manager|admin

Gives the user that role in the team (replacing the role they had there), creating the team
and the user when they do not exist. A new user needs a password: asked twice on the terminal,
or read from the environment variable named by ``--password-env`` (scripts, containers); an
existing user's password is left alone. Goes through ``incidents.teams.members.add_member``.
"""

from __future__ import annotations

import os
import sys
from getpass import getpass
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.errors import ServiceError
from incidents.models import Role
from incidents.teams.members import add_member


class Command(BaseCommand):
    help = "Give a user a role in a team (creating the team, and the user with a password)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--team", required=True, help="Team name (created if new).")
        parser.add_argument("--user", required=True, help="Username (created if new).")
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument(
            "--password-env",
            metavar="VAR",
            help="Environment variable holding the new user's password (instead of a prompt).",
        )
        parser.add_argument(
            "--no-input", action="store_false", dest="interactive", help="Never prompt."
        )

    def handle(self, *args: Any, team: str, user: str, role: str, **options: Any) -> None:
        password = None
        if not get_user_model().objects.filter(username=user.strip()).exists():
            password = self.new_password(user, options["password_env"], options["interactive"])
        try:
            added = add_member(team, user, role, password=password)
        except ServiceError as error:
            fields = "; ".join(f"{key} {why}" for key, why in error.fields.items())
            raise CommandError(f"{error.detail}{' (' + fields + ')' if fields else ''}") from None
        membership = added.membership
        if added.team_created:
            self.stdout.write(f"Created team {membership.team.name!r}.")
        if added.user_created:
            self.stdout.write(f"Created user {membership.user.username!r}.")
        was = f" (was {added.previous_role})" if added.previous_role else ""
        self.stdout.write(
            f"{membership.user.username!r} is now {membership.role} of "
            f"{membership.team.name!r}{was}."
        )

    def new_password(self, user: str, variable: str | None, interactive: bool) -> str:
        if variable:
            password = os.environ.get(variable, "")
            if not password:
                raise CommandError(f"--password-env {variable}: that variable is not set.")
            return password
        if not (interactive and sys.stdin.isatty()):
            raise CommandError(
                f"There is no user {user!r}: run interactively to type a password, or name an "
                "environment variable holding it with --password-env VAR."
            )
        password = getpass(f"Password for the new user {user!r}: ")
        if getpass("Password (again): ") != password:
            raise CommandError("The two passwords differ; nothing was changed.")
        return password
