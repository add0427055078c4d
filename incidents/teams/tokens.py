"""Personal API tokens: how a person's scripts call the console API without a browser session.

Stored hashed (sha256, as agent tokens: 256 random bits leave no dictionary to attack) and
shown once. Sent as ``Authorization: Token <token>`` or ``Authorization: Bearer bkp_…``.
Issuing and revoking are audited; a token acts with exactly its owner's roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from core.errors import InvalidInput, NotFound, Unauthenticated
from incidents.models import PersonalToken, hash_token
from incidents.teams.audit import AuditContext, audited
from incidents.teams.users import User

ISSUE_TOKEN = "issue_token"
REVOKE_TOKEN = "revoke_token"
# last_used_at is for people reviewing their tokens; minute precision spares a write per call.
LAST_USED_PRECISION = timedelta(minutes=1)


@dataclass(frozen=True)
class IssuedToken:
    token: PersonalToken
    raw: str  # shown once


def clean_token_name(name: str | None, message: str) -> str:
    """A token's name, as every kind of token takes it: 1 to 100 characters (400 otherwise)."""
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise InvalidInput(message, fields={"name": "1 to 100 characters"})
    return name


def issue_personal_token(
    user: User, name: str, *, context: AuditContext | None = None
) -> IssuedToken:
    """A new token for ``user`` (themselves: nobody mints tokens for somebody else)."""
    with audited(user, ISSUE_TOKEN, "user", user.pk, context) as attempt:
        attempt.allowed, attempt.reason = True, "Everyone may create their own tokens."
        name = clean_token_name(name, "Name the token (what it is for).")
        with transaction.atomic():
            token, raw = PersonalToken.issue(user, name)
            attempt.succeeded(f"token {token.prefix}… ({name}) issued")
    return IssuedToken(token, raw)


def revoke_personal_token(
    user: User, token_id: int, *, context: AuditContext | None = None
) -> PersonalToken:
    """Revoke one of the user's own tokens (another person's is 404). Twice is harmless."""
    with audited(user, REVOKE_TOKEN, "token", token_id, context) as attempt:
        attempt.allowed, attempt.reason = True, "Everyone may revoke their own tokens."
        with transaction.atomic():
            token = PersonalToken.objects.select_for_update().filter(pk=token_id, user=user).first()
            if token is None:
                raise NotFound(f"You have no token {token_id}.")
            if token.revoked_at is None:
                token.revoked_at = timezone.now()
                token.save(update_fields=["revoked_at"])
            attempt.succeeded(f"token {token.prefix}… revoked")
    return token


def authenticate_personal_token(raw_token: str) -> User:
    """The user a raw personal token belongs to; Unauthenticated if unknown or revoked."""
    token = (
        PersonalToken.objects.select_related("user")
        .filter(token_hash=hash_token(raw_token))
        .first()
    )
    if token is None:
        raise Unauthenticated("The token is unknown.", code="unknown_token")
    if token.revoked_at is not None:
        raise Unauthenticated("The token has been revoked.", code="revoked_token")
    if not token.user.is_active:
        raise Unauthenticated("The token's user is inactive.", code="inactive_user")
    now = timezone.now()
    if token.last_used_at is None or now - token.last_used_at > LAST_USED_PRECISION:
        PersonalToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user
