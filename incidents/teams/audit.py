"""The audit trail: every attempt to act, allowed or refused, with who, what, when, from where
and the outcome (docs/design.md "The authorisation chain": a refused action is a clear
403 that also shows in the audit trail).

Every person-facing service wraps its work in ``audited(...)``:

    with audited(user, Action.PAUSE_JOB, "job", job_id, context) as attempt:
        job = ...                       # NotFound → audited as refused, 404
        attempt.check(decide(...))      # Forbidden → audited as refused, 403
        with transaction.atomic():
            ...                         # the transition
            attempt.succeeded("…")      # the row commits with the transition

A successful attempt's row is written inside the transition's transaction, so the record and
the effect commit (or roll back) together. A failed attempt's row is written after the failing
transaction has rolled back, so the refusal is recorded even though the request fails.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from core.errors import Forbidden, ServiceError
from incidents.models import ActorKind, AuditEntry
from incidents.teams.authority import Decision, Role, role_at_least
from incidents.teams.users import User

logger = logging.getLogger(__name__)

USER_AGENT_MAX = 300
READ_AUDIT = "read_audit"
# Who reads a team's audit trail. Not (yet) an action of incidents.teams.authority.MATRIX: it
# changes nothing, and the matrix's tests and generated document are the authority module's.
AUDIT_READER_MINIMUM = Role.MANAGER


def audit_read_refusal(role: str | None) -> str | None:
    """None when ``role`` may read its team's audit trail, else the sentence saying why not."""
    if role_at_least(role, AUDIT_READER_MINIMUM):
        return None
    return (
        "Only a manager or above may read the team's audit trail; "
        f"your role in this team is {role or 'none'}."
    )


@dataclass(frozen=True)
class AuditContext:
    """Where an attempt came from: what the HTTP layer (or a consumer, a command) knows."""

    remote_addr: str | None = None
    user_agent: str = ""
    via: str = "internal"  # session, token, system, command, internal


SYSTEM_CONTEXT = AuditContext(via="system")


@dataclass
class Attempt:
    """One attempt being made; the service fills in what it learns as it goes."""

    actor: User | None  # None: the system
    action: str
    target_type: str
    target_id: int | None
    context: AuditContext
    team_id: int | None = None
    role: str | None = None
    level: str | None = None
    allowed: bool = False
    reason: str = ""
    entry_id: int | None = field(default=None, repr=False)

    def check(self, decision: Decision) -> None:
        """Record the authority's answer; raise Forbidden (403, its reason) when refused."""
        self.allowed, self.reason = decision.allowed, decision.reason
        self.role, self.level = decision.role, decision.level
        if not decision.allowed:
            raise Forbidden(decision.reason)

    def succeeded(self, outcome: str) -> AuditEntry:
        """Write the row of an attempt that worked (call it inside the transition's transaction)."""
        entry = _write(self, "ok", outcome)
        self.entry_id = entry.pk
        return entry


BIGINT_MAX = 2**63 - 1


def _text(value: str) -> str:
    """PostgreSQL text holds no NUL: a probe's NUL must not cost the row that records it."""
    return value.replace("\x00", "\ufffd")


def _write(attempt: Attempt, outcome_code: str, outcome: str) -> AuditEntry:
    context = attempt.context
    target_id = attempt.target_id
    if target_id is not None and not -BIGINT_MAX <= target_id <= BIGINT_MAX:
        # An id no row can have (a probe): the row keeps it in its outcome, not its column.
        outcome = f"{outcome} (target id {target_id})" if str(target_id) not in outcome else outcome
        target_id = None
    return AuditEntry.objects.create(
        at=timezone.now(),
        user=attempt.actor,
        actor_kind=ActorKind.SYSTEM if attempt.actor is None else ActorKind.PERSON,
        team_id=attempt.team_id,
        role=attempt.role if attempt.role and attempt.role != "system" else "",
        action=attempt.action,
        target_type=attempt.target_type,
        target_id=target_id,
        level=attempt.level or "",
        allowed=attempt.allowed,
        reason=_text(attempt.reason),
        outcome_code=outcome_code,
        outcome=_text(outcome),
        remote_addr=context.remote_addr or None,
        user_agent=_text(context.user_agent or "")[:USER_AGENT_MAX],
        via=context.via,
    )


def _record_failure(attempt: Attempt, outcome_code: str, outcome: str) -> None:
    if attempt.entry_id is not None and AuditEntry.objects.filter(pk=attempt.entry_id).exists():
        return  # the effect committed before the error: its "ok" row stands
    connection = transaction.get_connection()
    if connection.needs_rollback:
        # An enclosing transaction of the caller's is broken: nothing can be written in it.
        logger.error("audit row lost (transaction broken): %s %s", attempt, outcome)
        return
    _write(attempt, outcome_code, outcome)


@contextmanager
def audited(
    actor: User | None,
    action: str,
    target_type: str,
    target_id: int | None,
    context: AuditContext | None = None,
) -> Iterator[Attempt]:
    """Audit the attempt made inside the block, whatever its outcome (see the module doc)."""
    attempt = Attempt(actor, str(action), target_type, target_id, context or AuditContext())
    try:
        yield attempt
    except ServiceError as error:
        _record_failure(attempt, error.code, f"{error.status}: {error.detail}")
        raise
    except Exception as error:
        # A bug or a lost database: still worth a row, but never mask the original error.
        try:
            _record_failure(attempt, "error", f"{type(error).__name__}: {error}")
        except Exception:  # noqa: BLE001
            logger.exception("could not write the audit row of a failed attempt")
        raise
    else:
        if attempt.entry_id is None:
            attempt.succeeded("done")
