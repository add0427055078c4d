"""A job's agent tokens: issued with the job, revoked when it retires, and the one check every
agent request passes (``authenticate_agent``)."""

from __future__ import annotations

from django.utils import timezone

from core.errors import Unauthenticated
from core.realtime import agent_group, publish_after_commit
from incidents.models import (
    AgentToken,
    Job,
    hash_token,
)


def issue_agent_token(job: Job) -> str:
    """A new token for ``job`` (the old ones stay valid until revoked)."""
    return AgentToken.issue(job)[1]


def revoke_agent_tokens(job: Job) -> int:
    """Revoke the job's tokens; its open agent sockets check theirs again at once (and close)."""
    revoked = AgentToken.objects.filter(job=job, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    if revoked:
        publish_after_commit(agent_group(job.pk), {"type": "agent.revoked"}, robust=True)
    return revoked


# Every request of every rank starts here: one plain statement (a raw queryset builds the Job
# without the ORM compiling a join each time, which cost more than PostgreSQL's answer).
_TOKEN_SQL = (
    f"SELECT j.*, t.revoked_at AS token_revoked_at FROM {Job._meta.db_table} j "
    f"JOIN {AgentToken._meta.db_table} t ON t.job_id = j.id WHERE t.token_hash = %s"
)


def authenticate_agent(raw_token: str) -> Job:
    """The job a raw agent token belongs to; Unauthenticated if unknown or revoked."""
    found = list(Job.objects.raw(_TOKEN_SQL, [hash_token(raw_token)]))  # token_hash is unique
    if not found:
        raise Unauthenticated("The agent token is unknown.", code="unknown_token")
    job = found[0]
    if getattr(job, "token_revoked_at", None) is not None:  # the SELECT's extra column
        raise Unauthenticated("The agent token has been revoked.", code="revoked_token")
    return job
