"""A brake that could not save is an alert of its own, paged.

``checkpoint_and_pause`` exists to keep the last good state. When the job answers that its
checkpoint failed (disk full, a read-only directory, a saver that raised), the training may
hold without a state to go back to, or go on: either way a person must know now, not when
they next read the timeline. The alert is at least L3 (L4 when the brake answered an L4), and
its action is none: the job already holds, or failed to; a second brake would fail the same
way.
"""

from __future__ import annotations

from django.utils import timezone

from breakers.models import Command
from core.text import fit
from incidents.alerts.lifecycle import AlertSignal, raise_or_update_alert
from incidents.models import Layer
from incidents.notifications.grouping import FAILED_BRAKE_RULE
from incidents.notifications.rounds import notify_alert

RULE_KEY = FAILED_BRAKE_RULE
RULE_NAME = "Brake checkpoint failed"


def raise_failed_brake_alert(command: Command) -> int:
    """Raise (or refresh) the job's failed-brake alert for this acknowledgement; its id."""
    now = timezone.now()
    step = command.result.get("step")
    step = int(step) if isinstance(step, int) and not isinstance(step, bool) else 0
    held = (
        "the job holds without a new checkpoint"
        if command.result.get("paused")
        else ("the job did not say it holds")
    )
    signal = AlertSignal(
        rule_key=RULE_KEY,
        rule_name=RULE_NAME,
        layer=Layer.HEALTH,
        severity="L4" if command.severity == "L4" else "L3",
        metric="checkpoint.failed",
        node="",
        value=1.0,
        threshold=None,
        description=fit(
            f"The brake's checkpoint failed ({command.kind} #{command.pk}): "
            f"{command.error or 'no reason given'}; {held}. The last good state is the "
            "previous checkpoint, if any.",
            2000,
        ),
        step=step,
        time=now,
        first_step=step,
        first_time=command.acknowledged_at or now,
        action="none",
        runbook_hint="checkpoint failed",
    )
    outcome = raise_or_update_alert(command.job_id, signal, now=now)
    if outcome.action_due:
        notify_alert(outcome.alert.pk)  # after commit
    return outcome.alert.pk
