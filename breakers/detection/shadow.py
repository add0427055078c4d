"""Shadow mode: rules that observe only.

A rule with ``shadow`` set is evaluated on live data exactly like the others (same engine, same
episodes), but the evaluation hands its findings here instead of to the alert lifecycle: no
alert, no incident, no page, no command. What it would have done is kept as ``ShadowFiring``
rows, one per episode, so the rules page can show how often it would have fired and how that
compares with the incidents that really happened (``breakers.detection.shadow_report``).

Promoting a shadow rule to live is a change of the rule set like any other: a new version,
with its reason, audited (``promote_rule``, the one verb the page and the API call).

The rules judged outside the engine ask the same rule set the same question (``shadow_rule``)
and record the same rows (``record_signal``): the watchdog's heartbeat-timeout, and the
Alertmanager alerts about a DCGM signal (governed by the rule-pack rule of that signal).
An episode still open when its job ends is closed by the watchdog (``close_ended_jobs``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from breakers.detection import rulesets
from breakers.detection.engine import Finding, RuleSpec
from breakers.detection.rules import effective_rules
from breakers.models import RuleSetVersion, ShadowFiring
from core.errors import Conflict, InvalidInput, NotFound
from incidents.alerts.lifecycle import AlertSignal
from incidents.models import FINAL_JOB_STATUSES, Team
from incidents.teams.access import scoped_get
from incidents.teams.audit import AuditContext
from incidents.teams.users import User

__all__ = [
    "close_ended_jobs",
    "close_firing",
    "has_open_firing",
    "promote_rule",
    "record_firing",
    "record_signal",
    "shadow_rule",
    "would_have_fired",
]


def _moment(epoch_seconds: float) -> datetime:
    return datetime.fromtimestamp(epoch_seconds, tz=UTC)


def has_open_firing(job_id: int, rule_key: str, node: str) -> bool:
    return ShadowFiring.objects.filter(
        job_id=job_id, rule_key=rule_key, node=node, cleared_at__isnull=True
    ).exists()


def record_firing(job_id: int, finding: Finding, node: str) -> ShadowFiring:
    """What the alert of ``finding`` would have been: a new row for a new episode, or the open
    episode's row widened (another rank, a later step). The caller's transaction holds the
    job's evaluation lock, so two evaluations never race on one row."""
    return _record(
        job_id,
        node,
        finding.rank,
        rule_key=finding.rule_key,
        rule_name=finding.rule_name,
        severity=finding.severity,
        layer=finding.layer,
        action=finding.action,
        metric=finding.metric,
        value=finding.value,
        threshold=finding.threshold,
        description=finding.description[:2000],
        first_step=finding.first_step,
        first_time=_moment(finding.first_time),
        fired_step=finding.step,
        fired_at=_moment(finding.time),
    )


def record_signal(job_id: int, rule_key: str, signal: AlertSignal) -> ShadowFiring:
    """What an alert raised outside the engine (the watchdog's on a silent job, an
    Alertmanager alert routed to the job) would have been, under the rule ``rule_key`` that is
    in shadow mode: kept like a finding, with the level and action it would have had. The
    caller holds what serialises that door (the silence's claim, the alert's fingerprint)."""
    return _record(
        job_id,
        signal.node,
        None,
        rule_key=rule_key,
        rule_name=signal.rule_name[:200],
        severity=signal.severity,
        layer=signal.layer,
        action=signal.action,
        metric=signal.metric[:200],
        value=signal.value,
        threshold=signal.threshold,
        description=signal.description[:2000],
        first_step=signal.first_step,
        first_time=signal.first_time,
        fired_step=signal.step,
        fired_at=signal.time,
    )


def _record(job_id: int, node: str, rank: int | None, **fields: Any) -> ShadowFiring:
    open_row = (
        ShadowFiring.objects.filter(
            job_id=job_id, rule_key=fields["rule_key"], node=node, cleared_at__isnull=True
        )
        .order_by("-pk")
        .first()
    )
    if open_row is not None:
        ranks = set(open_row.ranks) | ({rank} if rank is not None else set())
        open_row.ranks = sorted(ranks)
        open_row.last_step = max(open_row.last_step, fields["fired_step"])
        open_row.findings += 1
        open_row.save(update_fields=["ranks", "last_step", "findings"])
        return open_row
    return ShadowFiring.objects.create(
        job_id=job_id,
        node=node,
        ranks=[rank] if rank is not None else [],
        last_step=fields["fired_step"],
        recorded_at=timezone.now(),
        **fields,
    )


def shadow_rule(team_id: int | None, rule_key: str) -> RuleSpec | None:
    """The team's rule ``rule_key`` when it is enabled and in shadow mode, else None: how a
    door other than the engine (the Alertmanager receiver) asks the one rule set whether
    what it is about to raise is observe only."""
    for rule in effective_rules(team_id):
        if rule.key == rule_key:
            return rule if rule.shadow and rule.enabled else None
    return None


def close_ended_jobs(now: datetime | None = None, batch: int = 200) -> int:
    """Close the open episodes of jobs that ended (a final status: finished, terminated): no
    point will come to clear them. Each row closes once (the UPDATE's own condition), so a
    second sweep closes nothing; returns how many closed."""
    ended = (
        ShadowFiring.objects.filter(cleared_at__isnull=True, job__status__in=FINAL_JOB_STATUSES)
        .order_by("pk")
        .values_list("pk", "job__status", "job__current_step")[:batch]
    )
    closed = 0
    for pk, status, step in list(ended):
        closed += ShadowFiring.objects.filter(pk=pk, cleared_at__isnull=True).update(
            cleared_at=now or timezone.now(),
            cleared_step=step,
            cleared_reason=f"the job is {status}: nothing is left to observe",
        )
    return closed


def would_have_fired(job_id: int, limit: int = 20) -> list[dict[str, Any]]:
    """The job's would-have-fired episodes, oldest first (a drill's scorecard lists them)."""
    rows = ShadowFiring.objects.filter(job_id=job_id).order_by("fired_at", "pk")[:limit]
    return [
        {
            "rule_key": row.rule_key,
            "severity": row.severity,
            "action": row.action,
            "first_step": row.first_step,
            "fired_step": row.fired_step,
            "fired_at": row.fired_at,
            "ranks": list(row.ranks),
        }
        for row in rows
    ]


def close_firing(
    job_id: int, rule_key: str, node: str, *, reason: str, step: int | None, at: float | None
) -> int:
    """Close the open episode of a shadow rule (its condition cleared, or the rule went live or
    away); returns how many rows closed (0 or 1)."""
    return ShadowFiring.objects.filter(
        job_id=job_id, rule_key=rule_key, node=node, cleared_at__isnull=True
    ).update(
        cleared_at=_moment(at) if at is not None else timezone.now(),
        cleared_step=step,
        cleared_reason=reason[:300],
    )


def promote_rule(
    user: User, team_id: int, key: Any, why: Any, *, context: AuditContext | None = None
) -> RuleSetVersion:
    """Make a shadow rule of the team live: a new rule set version with ``why`` (admins), through
    ``rulesets.change_rules`` (authority, audit row, the version's diff). 409 when the rule is
    not in shadow mode; 400 naming ``key`` when there is no such rule."""
    change = [{"op": "update", "key": key, "fields": {"shadow": False}}]
    try:
        team = scoped_get(Team.objects, user, team_id, team_path="id", noun="team")
    except NotFound:
        # The rules' own verb audits the probe for the owning team, then answers the 404.
        return rulesets.change_rules(user, team_id, why, change, context=context)
    if not isinstance(key, str) or not key:
        raise InvalidInput("Name the rule to promote.", fields={"key": "required"})
    rule = rulesets.live_snapshot(team.pk)["rules"].get(key)
    if rule is not None and not rule.get("shadow"):
        raise Conflict(f"Rule {key!r} is live already: only a shadow rule is promoted.")
    return rulesets.change_rules(user, team.pk, why, change, context=context)
