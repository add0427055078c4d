"""A team's own training command as its drill workload (docs/drills.md, "Your own training
command"), the service every front door calls (API, the drills page).

The command runs on the console's machine (or its Slurm) as the console's user, so two keys
are needed: the operator's ``BRAKELINE_DRILL_TEAM_COMMANDS`` and a team admin
(``run_drill``). Both command lines are argument lists in shell syntax, split with ``shlex``
and never given to a shell; the program must be an absolute path to an executable file, so
the allowlisted PATH of the sandbox never decides what runs.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from django.conf import settings
from django.db import transaction

from breakers.models import DrillWorkload
from core.errors import Forbidden, InvalidInput
from incidents.models import Team
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.users import User

FIELDS = ("command", "verify_command")
MAX_COMMAND_LENGTH = 2000
NOT_ENABLED = (
    "Teams' own drill commands are off on this console: its operator enables them with "
    "BRAKELINE_DRILL_TEAM_COMMANDS=true."
)


def team_commands_enabled() -> bool:
    return bool(settings.DRILL_TEAM_COMMANDS)


def team_workload(team: Team | int) -> DrillWorkload | None:
    """The team's own workload when the operator allows them and the team set one."""
    if not team_commands_enabled():
        return None
    team_id = team if isinstance(team, int) else team.pk
    return DrillWorkload.objects.filter(team_id=team_id).first()


def parse_command(value: Any, name: str) -> list[str]:
    """The command line as arguments; InvalidInput naming ``name`` when it is not one."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{name} must be a command line.", fields={name: "a command line"})
    if len(value) > MAX_COMMAND_LENGTH or "\x00" in value:
        raise InvalidInput(
            f"{name} is too long or holds a NUL character.",
            fields={name: f"at most {MAX_COMMAND_LENGTH} characters"},
        )
    try:
        arguments = shlex.split(value)
    except ValueError as error:  # an unclosed quote
        raise InvalidInput(f"{name}: {error}.", fields={name: str(error)}) from None
    program = arguments[0] if arguments else ""
    if not os.path.isabs(program):
        raise InvalidInput(
            f"{name} must start with the program's absolute path, not {program!r}.",
            fields={name: "the program as an absolute path (/opt/venv/bin/python …)"},
        )
    if not (os.path.isfile(program) and os.access(program, os.X_OK)):
        raise InvalidInput(
            f"{name}: {program} is not an executable file on the console's machine.",
            fields={name: f"{program} is not an executable file"},
        )
    return arguments


def save_team_workload(
    user: User, team_id: int, data: dict[str, Any], *, context: AuditContext | None = None
) -> DrillWorkload | None:
    """Set the team's own drill workload (admins, where the operator allows it); an empty
    ``command`` removes it (the team's drills run the built-in workload again)."""
    with audited(user, Action.RUN_DRILL, "team", team_id, context) as attempt:
        team = scoped_get(Team.objects, user, team_id, team_path="id", noun="team", attempt=attempt)
        attempt.team_id = team.pk
        attempt.check(decide(role_in_team(user, team.pk), Action.RUN_DRILL))
        if not team_commands_enabled():
            raise Forbidden(NOT_ENABLED)
        if not isinstance(data, dict):
            raise InvalidInput("A JSON object is expected.", fields={"command": "required"})
        if data.get("command") in ("", None):
            DrillWorkload.objects.filter(team=team).delete()
            attempt.succeeded(f"drill workload of {team.name}: the built-in one")
            return None
        for name in FIELDS:
            parse_command(data.get(name), name)
        with transaction.atomic():
            workload, _ = DrillWorkload.objects.update_or_create(
                team=team,
                defaults={
                    "command": data["command"].strip(),
                    "verify_command": data["verify_command"].strip(),
                    "updated_by": user,
                },
            )
        attempt.succeeded(f"drill workload of {team.name}: {workload.command[:200]}")
    return workload
