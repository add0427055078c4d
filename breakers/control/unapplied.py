"""Loud misuse: a job that keeps training while a command it received is never applied.

Commands are applied only at ``run.step_boundary`` (docs/sdk.md). A loop that never calls it
streams metrics happily while every command waits, until the command's deadline expires and an
executor stops a healthy process. The watchdog looks for delivered, unacknowledged commands
whose job's step has moved ``UNAPPLIED_STEPS`` past the step it had at delivery, and says so
at once with an L2 alert ("commands are not being applied — is step_boundary called?"),
long before the deadline; the acknowledgement resolves it.

One job's data can never stop the duty for the others: the arithmetic is done where it cannot
overflow a bigint (the job's step minus the margin, never a step plus it), and each job's alert
is raised on its own savepoint — a failure is logged, counted (``duty_failures``, on
``/metrics``) and the next job is flagged all the same.
"""

from __future__ import annotations

from django.db.models import F, Value
from django.db.models.functions import Coalesce, Greatest

from breakers.control.duties import per_job
from breakers.models import Command, CommandStatus
from core.text import fit
from incidents.alerts.lifecycle import (
    AlertSignal,
    active_alert,
    raise_or_update_alert,
    resolve_alert,
)
from incidents.models import Layer

DUTY = "flag_unapplied_commands"
UNAPPLIED_STEPS = 50
RULE_KEY = "commands-not-applied"
RULE_NAME = "Commands are not being applied"


def flag_unapplied_commands(limit: int = 100) -> int:
    """One indexed query; an alert per job (its fingerprint), refreshed while it lasts."""
    stuck = (
        Command.objects.filter(
            status=CommandStatus.DELIVERED,
            delivered_step__isnull=False,
            # A multi-rank job's command waits for its apply_at_step on purpose: counted from
            # there, not from its delivery.
        )
        .alias(margin=F("job__current_step") - UNAPPLIED_STEPS)
        .filter(margin__gte=Greatest(F("delivered_step"), Coalesce(F("apply_at_step"), Value(0))))
        .select_related("job")
        .order_by("pk")[:limit]
    )
    flagged = 0
    for command in stuck:
        job = command.job
        with per_job(DUTY, job.pk) as ok:
            if active_alert(job.pk, RULE_KEY, "") is not None:
                continue
            raise_or_update_alert(job.pk, _signal(command))
        flagged += ok.succeeded
    return flagged


def _signal(command: Command) -> AlertSignal:
    job = command.job
    step = int(job.current_step or 0)
    description = fit(
        f"{command.kind} #{command.pk} reached the job at step {command.delivered_step} and is "
        f"still not applied at step {step}: commands are not being applied — is "
        "run.step_boundary(step) called in the training loop?",
        2000,
    )
    at = job.last_metric_at or command.delivered_at or command.issued_at
    return AlertSignal(
        rule_key=RULE_KEY,
        rule_name=RULE_NAME,
        layer=Layer.STABILITY,
        severity="L2",
        metric="commands",
        node="",
        value=float(step - (command.delivered_step or 0)),
        threshold=float(UNAPPLIED_STEPS),
        description=description,
        step=step,
        time=at,
        first_step=int(command.delivered_step or 0),
        first_time=command.delivered_at or command.issued_at,
        action="none",
        runbook_hint="step_boundary commands not applied",
    )


def clear_unapplied(job_id: int, step: int | None) -> None:
    """A command was acknowledged: the loop does apply commands."""
    alert = active_alert(job_id, RULE_KEY, "")
    if alert is not None:
        resolve_alert(alert.pk, reason="the job acknowledged its command", step=step)
