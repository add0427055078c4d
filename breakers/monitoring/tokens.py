"""A team's integration tokens (Alertmanager's webhook): issued and revoked by the team's
admins, audited. They decide what may brake the team's jobs from outside, so they weigh like
the notification channels (``Action.MANAGE_NOTIFICATIONS``: admins)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from breakers.models import IntegrationToken
from incidents.models import Team
from incidents.teams.access import role_in_team, scoped_get
from incidents.teams.audit import AuditContext, audited
from incidents.teams.authority import Action, decide
from incidents.teams.tokens import clean_token_name


@dataclass(frozen=True)
class IssuedIntegrationToken:
    token: IntegrationToken
    raw: str  # shown once


def issue_integration_token(
    user: Any, team_id: int, name: str, *, context: AuditContext | None = None
) -> IssuedIntegrationToken:
    """404 outside the user's teams, 403 below admin, 400 for a missing or long name."""
    with audited(user, Action.MANAGE_NOTIFICATIONS, "team", team_id, context) as attempt:
        team = scoped_get(Team.objects, user, team_id, team_path="id", noun="team", attempt=attempt)
        attempt.check(decide(role_in_team(user, team.pk), Action.MANAGE_NOTIFICATIONS))
        name = clean_token_name(name, "Name the token (what sends with it).")
        with transaction.atomic():
            token, raw = IntegrationToken.issue(team, name)
            attempt.succeeded(f"integration token {token.prefix}… ({name}) issued")
    return IssuedIntegrationToken(token, raw)


def revoke_integration_token(
    user: Any, token_id: int, *, context: AuditContext | None = None
) -> IntegrationToken:
    """Revoke a token of one of the user's teams (admins). Twice is harmless."""
    with audited(
        user, Action.MANAGE_NOTIFICATIONS, "integration_token", token_id, context
    ) as attempt:
        tokens = IntegrationToken.objects.select_related("team")
        token = scoped_get(
            tokens, user, token_id, team_path="team_id", noun="integration token", attempt=attempt
        )
        attempt.check(decide(role_in_team(user, token.team_id), Action.MANAGE_NOTIFICATIONS))
        with transaction.atomic():
            locked = IntegrationToken.objects.select_for_update().get(pk=token.pk)
            if locked.revoked_at is None:
                locked.revoked_at = timezone.now()
                locked.save(update_fields=["revoked_at"])
            attempt.succeeded(f"integration token {locked.prefix}… revoked")
    return locked
