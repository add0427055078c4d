"""What the verdict is given: the evidence of one automatic L3 brake, read from the console's
records (the brake's alert and command, the rule in force, the job's earlier recoveries, its
hardware alerts, the checkpoint catalogue, what re-running the refused step found). The verdict
itself is ``breakers.recovery.verdict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from breakers.checkpoints import catalogue
from breakers.detection.rules import rules_for_job
from breakers.drills.scenarios import SCENARIOS, rehearses_recovery
from breakers.models import Command, DrillRun
from breakers.monitoring.dcgm import agent_rules
from breakers.recovery.attribution import weighed
from breakers.recovery.reruns import reruns_of
from breakers.recovery.verdict import HOLD_POLICY, RECOVER_POLICY, EarlierRecovery, Evidence
from incidents.models import (
    ActorKind,
    Alert,
    Incident,
    Job,
    JobRank,
    PauseConfirmation,
    Recovery,
    RecoveryVerdict,
)

# Rules whose alert on a node is a hardware signal: the default pack's hardware rules, DCGM's
# fields pushed through the agent, and whatever the cluster's Alertmanager routed to the job.
HARDWARE_RULES = frozenset(
    {"hardware-error", "communication-failure", "nodes-failing"}
    | {rule["key"] for rule in agent_rules()}
)
EXTERNAL_PREFIX = "alertmanager:"
HARDWARE_WINDOW = timedelta(hours=1)
BUDGET_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Gathered:
    evidence: Evidence
    incident: Incident
    alert: Alert
    checkpoint: dict[str, Any] | None  # the catalogue's last clean entry


def _rule_policy(job_id: int, rule_key: str) -> tuple[str, int, str]:
    """The rule's policy, budget and cause (its runbook entry, else its key)."""
    rule = next((r for r in rules_for_job(job_id) if r.key == rule_key), None)
    if rule is None:
        return HOLD_POLICY, 1, rule_key
    return rule.recovery, rule.recovery_budget, rule.runbook or rule.key


def drill_of_recovery(job: Job) -> bool:
    """Whether ``job`` is the sandbox of a drill of the recovery path (docs/drills.md): a job
    the console created as a drill sandbox, and a drill of such a scenario runs on it. Never a
    team's real job, whatever a drill row says."""
    if not job.drill_sandbox:
        return False
    scenarios = [name for name in SCENARIOS if rehearses_recovery(name)]
    return DrillRun.objects.filter(job_id=job.pk, scenario__in=scenarios).exists()


def _rank_on(job_id: int, node: str) -> int | None:
    if not node:
        return None
    ranks = JobRank.objects.filter(job_id=job_id, hostname=node).order_by("rank")
    return ranks.values_list("rank", flat=True).first()


HARDWARE_ALERTS_READ = 200


def hardware_signals(job_id: int, node: str, *, now: Any = None) -> list[str]:
    """The job's hardware alerts of the last hour on ``node`` (any node when the braking rule
    pools them), newest first, as short lines."""
    now = now or timezone.now()
    hardware = Q(rule_key__in=HARDWARE_RULES) | Q(rule_key__startswith=EXTERNAL_PREFIX)
    alerts = Alert.objects.filter(hardware, job_id=job_id, last_seen_at__gte=now - HARDWARE_WINDOW)
    # The node is matched here rather than with a JSON containment lookup, which the embedded
    # mode's SQLite does not have; a job's hardware alerts of one hour are few.
    on_node = [
        a
        for a in alerts.order_by("-last_seen_at")[:HARDWARE_ALERTS_READ]
        if not node or a.node == node or node in (a.nodes or [])
    ]
    return [
        f"{a.rule_key} on {a.node or ', '.join(a.nodes) or 'the job'} ({a.severity}, {a.status})"
        for a in on_node[:5]
    ]


def _earlier(job_id: int, pause_id: int, now: Any) -> tuple[list[EarlierRecovery], int]:
    rows = Recovery.objects.filter(job_id=job_id, verdict=RecoveryVerdict.RECOVER).exclude(
        pause_command_id=pause_id
    )
    earlier = [
        EarlierRecovery(r.cause, r.first_step, r.last_step) for r in rows.order_by("decided_at")
    ]
    return earlier, rows.filter(decided_at__gte=now - BUDGET_WINDOW).count()


def person_in_charge(incident: Incident, alert: Alert, pause: Command) -> str:
    """Who took this over from the machine: the incident's taker, else a person who sent the
    job a command since the alert was raised or confirmed this pause (any manual action
    cancels the automatic plan, even one made before the verdict)."""
    if incident.taken_over_by_id is not None:
        return f"{incident.taken_over_by} took over this incident"
    command = (
        Command.objects.filter(
            job_id=pause.job_id, issued_by_kind=ActorKind.PERSON, issued_at__gte=alert.raised_at
        )
        .select_related("issued_by")
        .order_by("pk")
        .first()
    )
    if command is not None:
        return f"{command.issued_by} sent {command.kind} #{command.pk}: a person is acting"
    confirmed = PauseConfirmation.objects.filter(pause_command_id=pause.pk).first()
    if confirmed is not None:
        return f"{confirmed.decided_by} confirmed pause #{pause.pk}: {confirmed.decision}"
    return ""


def _last_clean(job_id: int) -> dict[str, Any] | None:
    return next((entry for entry in catalogue(job_id) if entry["preselected"]), None)


def _policy_for(job: Job, alert: Alert) -> tuple[str, int, str, bool]:
    """The alert's rule's recovery policy, budget and cause for the job, and whether the job
    is a drill of the recovery path."""
    policy, budget, cause = _rule_policy(job.pk, alert.rule_key)
    rehearsal = drill_of_recovery(job)
    if rehearsal:
        # The drill rehearses the recovery path whatever the rule's policy for the team's
        # jobs: a drill never changes the team's rules, and its sandbox is its own.
        policy = RECOVER_POLICY
    return policy, budget, cause, rehearsal


def _last_bad_step(pause: Command, alert: Alert) -> int:
    """The episode's last step: where the pause took effect, never before the alert's first."""
    step = pause.result.get("step")
    last_step = step if isinstance(step, int) and step >= alert.first_step else alert.step
    return max(last_step, alert.first_step)


def gather(pause: Command, *, now: Any = None) -> Gathered | None:
    """The evidence of an automatic L3 brake whose checkpoint is confirmed; None when the
    command is not one (a person's pause, a brake without an alert or incident)."""
    now = now or timezone.now()
    if pause.alert_id is None:
        return None
    alert = Alert.objects.filter(pk=pause.alert_id).select_related("incident").first()
    if alert is None or alert.incident is None:
        return None
    job = Job.objects.get(pk=pause.job_id)
    policy, budget, cause, rehearsal = _policy_for(job, alert)
    last_step = _last_bad_step(pause, alert)
    earlier, last_hour = _earlier(job.pk, pause.pk, now)
    incident = alert.incident
    checkpoint = _last_clean(job.pk)
    evidence = Evidence(
        rule_key=alert.rule_key,
        cause=cause,
        policy=policy,
        budget=budget,
        first_step=alert.first_step,
        last_step=last_step,
        rank=_rank_on(job.pk, alert.node),
        node=alert.node,
        earlier=earlier,
        recoveries_last_hour=last_hour,
        hardware_signals=hardware_signals(job.pk, alert.node, now=now),
        clean_checkpoint_step=checkpoint["step"] if checkpoint is not None else None,
        min_progress_steps=settings.RECOVERY_MIN_PROGRESS_STEPS,
        max_skip_steps=settings.RECOVERY_MAX_SKIP_STEPS,
        drill=job.drill_sandbox,
        drill_of_recovery=rehearsal,
        taken_over_by=person_in_charge(incident, alert, pause),
        rerun=weighed(reruns_of(pause), alert.first_step, last_step),
    )
    return Gathered(evidence, incident, alert, checkpoint)


def evidence_out(evidence: Evidence) -> dict[str, Any]:
    """The evidence as the Recovery row keeps it (JSON)."""
    return {
        "rule_key": evidence.rule_key,
        "cause": evidence.cause,
        "policy": evidence.policy,
        "budget": evidence.budget,
        "window": [evidence.first_step, evidence.last_step],
        "rank": evidence.rank,
        "node": evidence.node,
        "earlier": [[e.cause, e.first_step, e.last_step] for e in evidence.earlier],
        "recoveries_last_hour": evidence.recoveries_last_hour,
        "hardware_signals": list(evidence.hardware_signals),
        "clean_checkpoint_step": evidence.clean_checkpoint_step,
        "min_progress_steps": evidence.min_progress_steps,
        "max_skip_steps": evidence.max_skip_steps,
        "drill": evidence.drill,
        "drill_of_recovery": evidence.drill_of_recovery,
        "taken_over_by": evidence.taken_over_by,
        "rerun": asdict(evidence.rerun) if evidence.rerun is not None else None,
    }
