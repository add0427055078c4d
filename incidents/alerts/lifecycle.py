"""Alerts and incidents: raising, escalating and resolving, each with its timeline row.

The breaker evaluator (``breakers.detection.evaluation``) turns engine findings into
``AlertSignal``s and
calls ``raise_or_update_alert`` / ``resolve_alert``; the heartbeat watchdog may do the same with
signals of its own. Nothing here imports ``breakers``.

Invariants, and how they hold under concurrent writers (two workers, evaluator and watchdog):
* at most one active (firing or acknowledged) alert per fingerprint (job, rule, node), and one
  active (open or mitigated) incident per job — partial unique indexes back both;
* every writer locks the job's active incident row *before* it reads or writes the incident's
  alerts (lock order: incident, then alert), so "is any alert still active?" (resolving the
  incident) and "attach a new alert" (raising) cannot interleave;
* raising locks the job's row before the incident's (lock order: job, incident, alert), the
  order of the control plane, which acknowledges a command under the job's row and then marks
  the incident mitigated: a raise holding the incident while it waits for the job (to issue
  the brake, or for the foreign-key checks of its new rows at commit) would deadlock with it;
* each status change is a compare-and-swap on the one status column, and writes its timeline
  row in the same transaction; websocket publishing happens only after commit.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from core.nonfinite import encode
from core.realtime import job_group, publish_after_commit, team_group
from core.text import fit
from core.transitions import compare_and_swap
from incidents.alerts.episode import episode_facts, episode_over
from incidents.alerts.runbook import GENERIC, RunbookEntry, format_suggestion, suggestion_for
from incidents.models import (
    ACTIVE_ALERT_STATUSES,
    ACTIVE_INCIDENT_STATUSES,
    ALERT_TRANSITIONS,
    INCIDENT_TRANSITIONS,
    ActorKind,
    Alert,
    AlertStatus,
    Incident,
    IncidentStatus,
    Job,
    Layer,
    TimelineEntry,
    TimelineKind,
)
from incidents.teams.users import User


@dataclass(frozen=True)
class AlertSignal:
    """One edge of a breaker episode, as data: what raises or updates an alert.

    ``node`` is the fingerprint's node: "" when the rule pools its nodes (then ``nodes`` still
    lists the nodes implicated). Times are aware datetimes; ``time`` is when the condition was
    observed, ``first_time``/``first_step`` its first anomalous point (for time to detect).
    """

    rule_key: str
    rule_name: str
    layer: str
    severity: str
    metric: str
    node: str
    value: float
    threshold: float | None
    description: str
    step: int
    time: datetime
    first_step: int
    first_time: datetime
    duration_seconds: float = 0.0
    duration_steps: int = 0
    action: str = "none"
    action_params: dict[str, Any] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()
    runbook_hint: str = ""  # a runbook key or any words naming the symptom


@dataclass(frozen=True)
class AlertOutcome:
    """What ``raise_or_update_alert`` did. ``created`` or ``escalated``: the alert's action is
    due now (the control plane issues it, see ``breakers.detection.evaluation.on_alert_raised``)."""

    alert: Alert
    created: bool
    escalated: bool  # an existing alert's severity rose
    incident_opened: bool
    previous_severity: str | None = None

    @property
    def action_due(self) -> bool:
        return self.created or self.escalated


# Rule actions that brake: their alert is spent once training resumes (rearm_after_resume).
REARMED_ACTIONS = ("checkpoint_and_pause", "pause_data", "terminate_and_isolate")


def alert_fingerprint(job_id: int, rule_key: str, node: str) -> str:
    return hashlib.sha256(f"{job_id}\x1f{rule_key}\x1f{node}".encode()).hexdigest()


def active_alert(job_id: int, rule_key: str, node: str) -> Alert | None:
    fingerprint = alert_fingerprint(job_id, rule_key, node)
    return Alert.objects.filter(fingerprint=fingerprint, status__in=ACTIVE_ALERT_STATUSES).first()


def append_timeline(
    incident_id: int,
    kind: str,
    message: str,
    *,
    at: datetime | None = None,
    alert_id: int | None = None,
    step: int | None = None,
    actor_kind: str = ActorKind.SYSTEM,
    actor: User | None = None,
    data: dict[str, Any] | None = None,
) -> TimelineEntry:
    """Append one row to an incident's timeline (call it inside the transition's transaction)."""
    return TimelineEntry.objects.create(
        incident_id=incident_id,
        kind=kind,
        message=message,
        at=at or timezone.now(),
        alert_id=alert_id,
        step=step,
        actor_kind=actor_kind,
        actor=actor,
        data=data or {},
    )


def raise_or_update_alert(
    job_id: int, signal: AlertSignal, *, now: datetime | None = None
) -> AlertOutcome:
    """Raise the signal's alert, or update the active one with the same fingerprint.

    A new alert joins the job's active incident, or opens one (timeline: first anomalous point,
    then alert raised). A higher severity than the incident's level raises the level (timeline:
    severity changed); so does a higher severity on an existing alert (rule edited).
    Performance-layer alerts are only recorded (docs/design.md "Metric layers": daily digest): no
    incident, no timeline.
    """
    now = now or timezone.now()
    with transaction.atomic():
        # The job's row first (see the lock order above): FOR UPDATE, as the brake's
        # issue_command takes it next in this transaction.
        Job.objects.select_for_update().filter(pk=job_id).values_list("pk").first()
        incident, opened = None, False
        if signal.layer != Layer.PERFORMANCE:
            incident, opened = _lock_or_open_incident(job_id, signal, now)
        existing = _lock_active_alert(job_id, signal)
        if existing is not None:
            return _update_alert(existing, incident, signal, now)
        alert = _create_alert(job_id, incident, signal, now)
        if incident is not None:
            _record_raised(incident, alert, signal, now, incident_opened=opened)
        _publish(alert, "alert.raised")
    return AlertOutcome(alert, created=True, escalated=False, incident_opened=opened)


def _lock_active_alert(job_id: int, signal: AlertSignal) -> Alert | None:
    """The signal's active alert (same fingerprint), row-locked; None when there is none."""
    return (
        Alert.objects.select_for_update()
        .filter(
            fingerprint=alert_fingerprint(job_id, signal.rule_key, signal.node),
            status__in=ACTIVE_ALERT_STATUSES,
        )
        .first()
    )


def _record_raised(
    incident: Incident,
    alert: Alert,
    signal: AlertSignal,
    now: datetime,
    *,
    incident_opened: bool,
) -> None:
    """The new alert's timeline row; joining an incident already open may raise its level."""
    append_timeline(
        incident.pk,
        TimelineKind.ALERT_RAISED,
        f"{alert.severity} {alert.rule_name}: {alert.description}",
        at=now,
        alert_id=alert.pk,
        step=signal.step,
        data={"alert_id": alert.pk, "severity": alert.severity, "action": alert.action},
    )
    if not incident_opened:
        _raise_incident_level(incident, alert, None, now, signal.step)


def resolve_alert(
    alert_id: int,
    *,
    reason: str,
    step: int | None = None,
    now: datetime | None = None,
    data: dict[str, Any] | None = None,
) -> bool:
    """firing/acknowledged → resolved, with its timeline row; the incident resolves with its
    last active alert. False when the alert was already resolved (nothing written)."""
    now = now or timezone.now()
    with transaction.atomic():
        incident = _lock_alerts_incident(alert_id)
        won = compare_and_swap(
            Alert,
            alert_id,
            table=ALERT_TRANSITIONS,
            expected=ACTIVE_ALERT_STATUSES,
            new=AlertStatus.RESOLVED,
            resolved_at=now,
        )
        if not won:
            return False
        alert = Alert.objects.select_related("job").get(pk=alert_id)  # as resolved
        if incident is not None:
            _record_resolved(incident, alert, reason, step, now, data)
        _publish(alert, "alert.resolved")
    return True


def _lock_alerts_incident(alert_id: int) -> Incident | None:
    """The alert's incident, row-locked before the alert (the lock order above); None when
    the alert has none (a performance-layer finding)."""
    incident_id = Alert.objects.values_list("incident_id", flat=True).get(pk=alert_id)
    if incident_id is None:
        return None
    # FOR NO KEY UPDATE, as every incident lock here: it still orders the incident's
    # writers, but lets through the foreign-key checks (FOR KEY SHARE) of rows that
    # reference the incident. With FOR UPDATE, a heartbeat resolving the watchdog's
    # alert (incident locked, waiting for the alert) deadlocked with the page of that
    # alert (alert locked, its deliveries' check on the incident waiting at COMMIT).
    return Incident.objects.select_for_update(no_key=True).get(pk=incident_id)


def _record_resolved(
    incident: Incident,
    alert: Alert,
    reason: str,
    step: int | None,
    now: datetime,
    data: dict[str, Any] | None,
) -> None:
    """The resolved alert's timeline row; the incident resolves with its last active alert."""
    append_timeline(
        incident.pk,
        TimelineKind.ALERT_RESOLVED,
        f"{alert.rule_name} resolved: {reason}",
        at=now,
        alert_id=alert.pk,
        step=step,
        data={"alert_id": alert.pk, **(data or {})},
    )
    _resolve_incident_if_quiet(incident, now, step)


def _lock_or_open_incident(
    job_id: int, signal: AlertSignal, now: datetime
) -> tuple[Incident, bool]:
    """The job's active incident, row-locked: the open one, else the episode the signal's
    condition began in (reopened), else a new one with its first row."""
    for _ in range(3):
        incident = (
            Incident.objects.select_for_update(no_key=True)
            .filter(job_id=job_id, status__in=ACTIVE_INCIDENT_STATUSES)
            .first()
        )
        if incident is not None:
            return incident, False
        try:
            with transaction.atomic():
                incident = _reopen_episode(job_id, signal, now)
                if incident is not None:
                    return incident, False
                incident = Incident.objects.create(
                    job_id=job_id,
                    title=fit(f"{signal.rule_name} ({signal.metric})", 300),
                    level=signal.severity,
                    opened_at=now,
                    first_step=signal.first_step,
                    first_time=signal.first_time,
                )
        except IntegrityError:
            # Another writer opened (or reopened) the job's incident first; its transaction
            # has committed, so the next lookup finds it.
            continue
        append_timeline(
            incident.pk,
            TimelineKind.FIRST_ANOMALOUS_POINT,
            f"First anomalous point: {signal.metric} at step {signal.first_step}",
            at=signal.first_time,
            step=signal.first_step,
            data={"metric": signal.metric, "rule_key": signal.rule_key, "node": signal.node},
        )
        return incident, True
    raise RuntimeError(f"could not open or find an active incident for job {job_id}")


def _reopen_episode(job_id: int, signal: AlertSignal, now: datetime) -> Incident | None:
    """The resolved incident whose episode the signal's condition began in, reopened."""
    incident = (
        Incident.objects.select_for_update(no_key=True)
        .filter(job_id=job_id, status=IncidentStatus.RESOLVED, resolved_step__gte=signal.first_step)
        .order_by("-opened_at")
        .first()
    )
    if incident is None:
        return None
    if not compare_and_swap(
        Incident,
        incident.pk,
        table=INCIDENT_TRANSITIONS,
        expected=[IncidentStatus.RESOLVED],
        new=IncidentStatus.OPEN,
        resolved_at=None,
        resolved_step=None,
    ):
        return None
    append_timeline(
        incident.pk,
        TimelineKind.INCIDENT_REOPENED,
        f"Reopened: {signal.rule_name} began at step {signal.first_step}, before the episode "
        f"ended at step {incident.resolved_step}",
        at=now,
        step=signal.first_step,
        data={"rule_key": signal.rule_key, "resolved_step": incident.resolved_step},
    )
    incident.refresh_from_db()
    return incident


def _create_alert(
    job_id: int, incident: Incident | None, signal: AlertSignal, now: datetime
) -> Alert:
    entry = _runbook_entry(signal)
    return Alert.objects.create(
        job_id=job_id,
        incident=incident,
        fingerprint=alert_fingerprint(job_id, signal.rule_key, signal.node),
        rule_key=fit(signal.rule_key, 100),
        rule_name=fit(signal.rule_name, 200),
        node=fit(signal.node, 200),
        nodes=list(signal.nodes),
        severity=signal.severity,
        layer=signal.layer,
        metric=fit(signal.metric, 200),
        value=signal.value,
        threshold=signal.threshold,
        description=signal.description,
        first_step=signal.first_step,
        first_time=signal.first_time,
        step=signal.step,
        raised_at=now,
        last_seen_at=now,
        duration_seconds=signal.duration_seconds,
        duration_steps=signal.duration_steps,
        action=signal.action,
        action_params=dict(signal.action_params),
        runbook_key=entry.key,
        runbook_suggestion=fit(format_suggestion(entry), 200),
        runbook=entry.to_dict(),
    )


def _update_alert(
    alert: Alert, incident: Incident | None, signal: AlertSignal, now: datetime
) -> AlertOutcome:
    """The condition fired again on an active alert: refresh it, escalate if more severe."""
    alert.value, alert.step, alert.last_seen_at = signal.value, signal.step, now
    alert.duration_seconds = (signal.time - alert.first_time).total_seconds()
    alert.duration_steps = signal.step - alert.first_step
    # The description follows the value and step it sits next to (they must not disagree).
    alert.description = signal.description or alert.description
    fields = [
        "value",
        "step",
        "last_seen_at",
        "duration_seconds",
        "duration_steps",
        "description",
    ]
    previous = alert.severity
    escalated = signal.severity > previous  # "L1" < "L2" < "L3" < "L4"
    if escalated:
        alert.severity, alert.action = signal.severity, signal.action
        alert.action_params, alert.description = dict(signal.action_params), signal.description
        fields += ["severity", "action", "action_params", "description"]
    alert.save(update_fields=fields)
    if escalated:
        if incident is not None:
            _raise_incident_level(incident, alert, previous, now, signal.step)
        _publish(alert, "alert.escalated")
    return AlertOutcome(
        alert, created=False, escalated=escalated, incident_opened=False, previous_severity=previous
    )


def _raise_incident_level(
    incident: Incident, alert: Alert, alert_was: str | None, now: datetime, step: int
) -> None:
    """One severity_changed row when the alert's severity or the incident's level rose."""
    incident_was = incident.level
    if alert.severity > incident_was:
        # The incident row is locked by this transaction: a plain conditional update suffices.
        # Its title follows the worst level reached: an L3 NaN incident is not named after the
        # L1 notice that happened to come first.
        title = fit(f"{alert.rule_name} ({alert.metric})", 300)
        Incident.objects.filter(pk=incident.pk, level__lt=alert.severity).update(
            level=alert.severity, title=title
        )
        incident.level, incident.title = alert.severity, title
    if alert_was is None and incident.level == incident_was:
        return  # a new alert below the incident's level: its alert_raised row says it all
    parts = []
    if alert_was is not None:
        parts.append(f"alert {alert.rule_name} {alert_was} → {alert.severity}")
    if incident.level != incident_was:
        parts.append(f"incident level {incident_was} → {incident.level}")
    append_timeline(
        incident.pk,
        TimelineKind.SEVERITY_CHANGED,
        "Severity changed: " + "; ".join(parts),
        at=now,
        alert_id=alert.pk,
        step=step,
        data={
            "alert_id": alert.pk,
            "alert": {"from": alert_was, "to": alert.severity} if alert_was else None,
            "incident": {"from": incident_was, "to": incident.level},
        },
    )


def _resolve_incident_if_quiet(incident: Incident, now: datetime, step: int | None) -> None:
    """The episode is over when none of the incident's alerts is active any more and, if it
    braked the job, the job is final or trains healthy again after a resume
    (incidents.alerts.episode)."""
    if not episode_over(episode_facts(incident), step):
        return
    won = compare_and_swap(
        Incident,
        incident.pk,
        table=INCIDENT_TRANSITIONS,
        expected=ACTIVE_INCIDENT_STATUSES,
        new=IncidentStatus.RESOLVED,
        resolved_at=now,
        resolved_step=step,
    )
    if won:
        append_timeline(
            incident.pk,
            TimelineKind.INCIDENT_RESOLVED,
            "Incident resolved: every alert of the episode has resolved",
            at=now,
            step=step,
        )


def settle_incident(job_id: int, step: int | None, now: datetime | None = None) -> bool:
    """Resolve the job's active incident if its episode is over now (after a resume, a
    terminate, healthy points). True if it was resolved."""
    with transaction.atomic():
        # The incident row only: FOR UPDATE over a join would lock the job's row too, and a
        # command being issued holds the job and waits for the incident (deadlock).
        incident = (
            Incident.objects.select_for_update(no_key=True)
            .filter(job_id=job_id, status__in=ACTIVE_INCIDENT_STATUSES)
            .first()
        )
        if incident is None:
            return False
        before = incident.status
        _resolve_incident_if_quiet(incident, now or timezone.now(), step)
        return Incident.objects.filter(pk=incident.pk).exclude(status=before).exists()


def rearm_after_resume(incident_id: int, step: int | None, now: datetime | None = None) -> int:
    """Training resumed after a brake: close the alerts whose brake was spent, so a
    recurrence raises a new alert and brakes again (the evaluator re-arms the rule when it
    finds its episode without an alert). The incident stays open until healthy. Returns how
    many alerts were re-armed."""
    alert_ids = list(
        Alert.objects.filter(
            incident_id=incident_id,
            status__in=ACTIVE_ALERT_STATUSES,
            action__in=REARMED_ACTIONS,
        ).values_list("pk", flat=True)
    )
    for alert_id in alert_ids:
        resolve_alert(
            alert_id,
            reason=f"training resumed at step {step}: a recurrence brakes again",
            step=step,
            now=now,
            data={"event": "rearmed"},
        )
    return len(alert_ids)


def _runbook_entry(signal: AlertSignal) -> RunbookEntry:
    """The rule's runbook hint first; when it names nothing known, the rule key and metric."""
    entry = suggestion_for(signal.runbook_hint, signal.metric) if signal.runbook_hint else GENERIC
    if entry is GENERIC:
        entry = suggestion_for(signal.rule_key, signal.metric)
    return entry


def alert_payload(alert: Alert) -> dict[str, Any]:
    """The alert as the console, notifications and the API show it (strict JSON)."""
    job = alert.job
    return {
        "id": alert.pk,
        "incident_id": alert.incident_id,
        "status": alert.status,
        "severity": alert.severity,
        "layer": alert.layer,
        "job": {
            "id": job.pk,
            "name": job.name,
            "team_id": job.team_id,
            "drill_sandbox": job.drill_sandbox,
        },
        "node": alert.node or None,
        "nodes": alert.nodes,
        "rule": {"key": alert.rule_key, "name": alert.rule_name},
        "metric": alert.metric,
        "value": encode(alert.value),
        "threshold": encode(alert.threshold),
        "duration_seconds": alert.duration_seconds,
        "duration_steps": alert.duration_steps,
        "first_step": alert.first_step,
        "first_time": alert.first_time.isoformat(),
        "step": alert.step,
        "raised_at": alert.raised_at.isoformat(),
        "description": alert.description,
        "action": alert.action,
        "action_params": alert.action_params,
        "runbook": {"suggestion": alert.runbook_suggestion, **alert.runbook},
        "snoozed_until": alert.snoozed_until.isoformat() if alert.snoozed_until else None,
    }


def _publish(alert: Alert, kind: str) -> None:
    payload = {"type": kind, "alert": alert_payload(alert)}
    publish_after_commit(job_group(alert.job_id), payload)
    publish_after_commit(team_group(alert.job.team_id), payload)
