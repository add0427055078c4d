"""Alertmanager's webhook in: each alert recorded by fingerprint, routed to a job, and turned
into that job's Brakeline alert through the one alert lifecycle and the one braking service.

* Firing, new fingerprint → an ``ExternalAlert`` row; routed → ``raise_or_update_alert`` with
  the DCGM classification, and when the alert is new or rose, ``on_alert_raised`` (the same
  automatic brake and paging as a breaker's alert: L4 → terminate + isolate_node, through
  Slurm when the job runs there). Not routed → kept, with the reason, in the unrouted list.
* Firing, known fingerprint → a repeat (Alertmanager resends every repeat_interval; an HA
  pair sends twice): counted, and retried for routing when it was unrouted. Nothing else.
* Resolved → the row resolves; the Brakeline alert resolves with the last of its rows.
* Firing again with the fingerprint *and* ``startsAt`` of an alert already resolved → a replay
  of that episode (a late resend, or somebody's copy): counted as a repeat, it opens nothing.

Each alert is applied in a short transaction of its own, under a lock on its fingerprint
(PostgreSQL's advisory lock): an HA pair delivering the same alert at once applies it once,
and a webhook of 1,000 alerts never holds a lock others wait on for its whole length (the
team's row, which the console's health check and every other webhook of the team read). A
retried webhook is idempotent by fingerprint.

The Brakeline alert's fingerprint is (job, rule, node), so the eight GPU alerts of one node
feed one alert, and every alert of the job joins its one active incident.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from django.db import connection, transaction
from django.utils import timezone

from breakers.detection import shadow
from breakers.detection.evaluation import on_alert_raised
from breakers.models import (
    EXTERNAL_ALERT_TRANSITIONS,
    ExternalAlert,
    ExternalAlertStatus,
    IntegrationToken,
)
from breakers.monitoring.alertmanager import ExternalAlertIn, WebhookIn
from breakers.monitoring.dcgm import Classification, classify, rule_of
from breakers.monitoring.routing import Route, route
from core.errors import Unauthenticated
from core.text import fit
from core.transitions import compare_and_swap
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert, resolve_alert
from incidents.models import Team, hash_token

LAST_USED_PRECISION_SECONDS = 60


@dataclass
class ReceiveReport:
    received: int = 0
    new: int = 0
    repeated: int = 0
    resolved: int = 0
    unrouted: int = 0
    shadow: int = 0  # routed under a rule in shadow mode: recorded, not raised
    alert_ids: list[int] = field(default_factory=list)  # Brakeline alerts fed

    def as_dict(self) -> dict:
        return {
            "received": self.received,
            "new": self.new,
            "repeated": self.repeated,
            "resolved": self.resolved,
            "unrouted": self.unrouted,
            "shadow": self.shadow,
            "alert_ids": sorted(set(self.alert_ids)),
        }


def authenticate_integration(raw_token: str) -> Team:
    """The team of an integration token; Unauthenticated when unknown or revoked."""
    token = (
        IntegrationToken.objects.select_related("team")
        .filter(token_hash=hash_token(raw_token))
        .first()
    )
    if token is None:
        raise Unauthenticated("The integration token is unknown.", code="unknown_token")
    if token.revoked_at is not None:
        raise Unauthenticated("The integration token has been revoked.", code="revoked_token")
    now = timezone.now()
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        IntegrationToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.team


def receive_alertmanager(
    team_id: int, webhook: WebhookIn, *, now: datetime | None = None
) -> ReceiveReport:
    """Apply one webhook, each alert in its own transaction under its fingerprint's lock
    (Alertmanager retries a failed webhook whole: what was applied is then a repeat)."""
    now = now or timezone.now()
    report = ReceiveReport(received=len(webhook.alerts))
    for alert in webhook.alerts:
        with transaction.atomic():
            _lock_fingerprint(team_id, alert.fingerprint)
            if alert.status == ExternalAlertStatus.FIRING:
                _fire(team_id, alert, webhook.group_key, now, report)
            else:
                _resolve(team_id, alert, now, report)
    return report


def _lock_fingerprint(team_id: int, fingerprint: str) -> None:
    """Until the transaction ends, no other delivery applies this alert of this team."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [team_id, fingerprint])
    else:  # the embedded SQLite writes one transaction at a time anyway
        Team.objects.select_for_update().filter(pk=team_id).first()


def _replayed(team_id: int, incoming: ExternalAlertIn) -> bool:
    """The same episode (fingerprint and start) was resolved already."""
    return ExternalAlert.objects.filter(
        team_id=team_id,
        fingerprint=incoming.fingerprint,
        starts_at=incoming.starts_at,
        status=ExternalAlertStatus.RESOLVED,
    ).exists()


def _fire(
    team_id: int, incoming: ExternalAlertIn, group_key: str, now: datetime, report: ReceiveReport
) -> None:
    firing = ExternalAlert.objects.select_for_update().filter(
        team_id=team_id, fingerprint=incoming.fingerprint, status=ExternalAlertStatus.FIRING
    )
    row = firing.first()
    if row is not None:
        row.repeats += 1
        row.last_seen_at = now
        row.save(update_fields=["repeats", "last_seen_at"])
        report.repeated += 1
        if row.job_id is None:
            _route_and_raise(row, route(team_id, incoming.labels), incoming, now, report)
        return
    if _replayed(team_id, incoming):
        report.repeated += 1
        return
    value = _value(incoming)
    verdict = classify(incoming.alertname, incoming.labels, value)
    target = route(team_id, incoming.labels)
    row = ExternalAlert.objects.create(
        team_id=team_id,
        fingerprint=incoming.fingerprint,
        alertname=fit(incoming.alertname, 200),
        labels=incoming.labels,
        annotations=incoming.annotations,
        group_key=group_key,
        starts_at=incoming.starts_at,
        ends_at=incoming.ends_at,
        node=fit(target.node, 200),
        level=verdict.level,
        why=fit(verdict.why, 300),
        received_at=now,
        last_seen_at=now,
    )
    report.new += 1
    _route_and_raise(row, target, incoming, now, report, verdict)


def _route_and_raise(
    row: ExternalAlert,
    target: Route,
    incoming: ExternalAlertIn,
    now: datetime,
    report: ReceiveReport,
    verdict: Classification | None = None,
) -> None:
    if target.job is None:
        if row.unrouted_reason != target.reason:
            row.unrouted_reason = fit(target.reason, 300)
            row.save(update_fields=["unrouted_reason"])
        report.unrouted += 1
        return
    verdict = verdict or classify(incoming.alertname, incoming.labels, _value(incoming))
    signal = _signal(verdict, incoming, target, _value(incoming))
    governing = shadow.shadow_rule(row.team_id, rule_of(incoming.labels, verdict.level) or "")
    if governing is not None:  # observe only: what it would have done, and nothing more
        shadow.record_signal(target.job.pk, governing.key, signal)
        row.job, row.node, row.unrouted_reason = target.job, target.node, ""
        row.save(update_fields=["job", "node", "unrouted_reason"])
        report.shadow += 1
        return
    outcome = raise_or_update_alert(target.job.pk, signal, now=now)
    if outcome.action_due:
        on_alert_raised(outcome)  # the breakers' own brake and paging, nothing of our own
    row.job, row.alert, row.node, row.unrouted_reason = target.job, outcome.alert, target.node, ""
    row.save(update_fields=["job", "alert", "node", "unrouted_reason"])
    report.alert_ids.append(outcome.alert.pk)


def _signal(
    verdict: Classification, incoming: ExternalAlertIn, target: Route, value: float
) -> AlertSignal:
    assert target.job is not None
    step = target.job.current_step or 0
    summary = incoming.annotations.get("summary") or incoming.annotations.get("description")
    where = f" on {target.node}" if target.node else ""
    gpu = incoming.labels.get("gpu")
    action = verdict.action
    unverified = ""
    if not target.verified and action not in ("none", "record"):
        # Paged at its level, never acted on: only the job's agent said it runs there.
        action = "none"
        unverified = (
            f"; node {target.node} reported by the agent, unverified (no operator or Slurm "
            "binding): no automatic action"
        )
    description = (
        f"{summary or verdict.rule_name}{where}"
        + (f" (GPU {gpu})" if gpu else "")
        + f": Alertmanager alert {incoming.alertname}, {verdict.why}{unverified}"
    )
    return AlertSignal(
        rule_key=verdict.rule_key,
        rule_name=verdict.rule_name,
        layer=verdict.layer,
        severity=verdict.level,
        metric=verdict.metric,
        node=target.node,
        value=value,
        threshold=None,
        description=description,
        step=step,
        time=incoming.starts_at,
        first_step=step,
        first_time=incoming.starts_at,
        action=action,
        nodes=(target.node,) if target.node else (),
        runbook_hint=verdict.runbook,
    )


def _value(incoming: ExternalAlertIn) -> float:
    """The alert's value when its rule put it in the ``value`` annotation ({{ $value }});
    NaN when it did not (NaN is data, never an error)."""
    for text in (incoming.annotations.get("value", ""), incoming.labels.get("xid", "")):
        try:
            return float(text)
        except ValueError:
            continue
    return math.nan


def _resolve(team_id: int, incoming: ExternalAlertIn, now: datetime, report: ReceiveReport) -> None:
    row = (
        ExternalAlert.objects.select_for_update()
        .filter(
            team_id=team_id, fingerprint=incoming.fingerprint, status=ExternalAlertStatus.FIRING
        )
        .first()
    )
    if row is None:
        return  # resolved before (a repeat), or never seen firing: nothing is active
    won = compare_and_swap(
        ExternalAlert,
        row.pk,
        table=EXTERNAL_ALERT_TRANSITIONS,
        expected=[ExternalAlertStatus.FIRING],
        new=ExternalAlertStatus.RESOLVED,
        resolved_at=now,
        ends_at=incoming.ends_at,
    )
    if not won:
        return
    report.resolved += 1
    if row.alert_id is None:
        _clear_shadow(row, incoming, now)
        return
    still = ExternalAlert.objects.filter(alert_id=row.alert_id, status=ExternalAlertStatus.FIRING)
    if not still.exists():
        resolve_alert(
            row.alert_id,
            reason=f"Alertmanager resolved {incoming.alertname}",
            now=now,
            data={"source": "alertmanager", "fingerprint": incoming.fingerprint},
        )
        report.alert_ids.append(row.alert_id)


def _clear_shadow(row: ExternalAlert, incoming: ExternalAlertIn, now: datetime) -> None:
    """A routed alert observed by a shadow rule resolved: its episode closes with the last
    firing alert of that rule on the job's node (as the Brakeline alert would have)."""
    key = rule_of(row.labels, row.level)
    if row.job_id is None or key is None:
        return
    others = ExternalAlert.objects.filter(
        job_id=row.job_id, node=row.node, alert__isnull=True, status=ExternalAlertStatus.FIRING
    )
    if any(rule_of(other.labels, other.level) == key for other in others):
        return
    shadow.close_firing(
        row.job_id,
        key,
        row.node,
        reason=f"Alertmanager resolved {incoming.alertname}",
        step=None,
        at=now.timestamp(),
    )
