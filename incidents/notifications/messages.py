"""What a page says: its text on each channel, its links to the console, and the marks of a
drill or of an alert resolved since."""

from __future__ import annotations

from django.conf import settings

from core.text import fit
from incidents.models import (
    SYSTEM_COMMAND_REFUSED,
    Alert,
    AlertStatus,
    TimelineEntry,
    TimelineKind,
)
from incidents.notifications.routing import (
    FIRST_LINE_LENGTH,
    AlertFacts,
    Message,
    render,
)


def console_link(path: str) -> str:
    """A console page's address as a message carries it (BRAKELINE_PUBLIC_URL + path)."""
    return str(settings.BRAKELINE_PUBLIC_URL).rstrip("/") + path


def job_link(job_id: int) -> str:
    return console_link(f"/jobs/{job_id}/")


DRILL_PREFIX = "DRILL — "


NO_BRAKE_ACTIONS = ("", "none", "record")


def refused_brake(alert: Alert) -> str:
    """The timeline's "No automatic pause: …" of this alert, if the system's brake was refused
    (breakers.control.braking writes it in the transaction that raised the alert)."""
    note = (
        TimelineEntry.objects.filter(
            alert_id=alert.pk, kind=TimelineKind.NOTE, data__event=SYSTEM_COMMAND_REFUSED
        )
        .order_by("-pk")
        .values_list("message", flat=True)
        .first()
    )
    return note or ""


def alert_message(alert: Alert) -> Message:
    job = alert.job
    message = render(
        AlertFacts(
            level=alert.severity,
            team=job.team.name,
            job_id=job.pk,
            job_name=job.name,
            metric=alert.metric,
            value=alert.value,
            threshold=alert.threshold,
            step=alert.step,
            duration_seconds=alert.duration_seconds,
            duration_steps=alert.duration_steps,
            node=alert.node,
            action=alert.action,
            runbook_suggestion=alert.runbook_suggestion,
            link=job_link(job.pk),
            refused=refused_brake(alert),
        )
    )
    if job.drill_sandbox:  # nobody may take a fire drill's page for the real thing
        body = f"This is a fire drill on a sandbox job: no action needed.\n{message.body}"
        return Message(fit(DRILL_PREFIX + message.first_line, FIRST_LINE_LENGTH), body)
    return message


RESOLVED_MARK = " (resolved since)"


def since_resolved(alert: Alert, message: Message) -> Message:
    """A page of an alert that resolved before it went out says so (see still_pages)."""
    if alert.status != AlertStatus.RESOLVED:
        return message
    when = alert.resolved_at.strftime("%H:%M:%S UTC") if alert.resolved_at else "since"
    first = fit(message.first_line, FIRST_LINE_LENGTH - len(RESOLVED_MARK)) + RESOLVED_MARK
    why = (
        f"it braked the job ({alert.action})"
        if alert.action not in NO_BRAKE_ACTIONS
        else (f"it reached {alert.severity}")
    )
    body = f"Resolved at {when}, before this page went out; paged because {why}.\n"
    return Message(first, body + message.body)
