"""Periodic tasks that span the apps (autodiscovered: this module is ``console.tasks``).

Expiring escalation requests may issue the system's automatic L3 pause, a ``breakers`` command,
so the task cannot live in ``incidents`` (which never imports ``breakers``).
"""

from __future__ import annotations

from celery import shared_task

from breakers.escalation_actions import expire_escalations as expire_due_escalations


@shared_task(name="escalations.expire", acks_late=True, ignore_result=True, expires=25)
def expire_escalations() -> int:
    """Beat, every 30 s: expire undecided escalation requests. Idempotent (compare-and-swap
    per request), so an overlapping or redelivered run does nothing twice."""
    return len(expire_due_escalations())
