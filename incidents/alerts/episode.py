"""When an incident's episode is over: the rule, and the facts it is judged on.

An incident without a brake ends when its last alert resolves. An incident *with* a brake (the
system or a person paused, stopped or held the job) lives as long as the episode does: until
the job is final (terminated, finished), or a person resumed it and it has trained
``HEALTHY_STEPS_AFTER_RESUME`` steps with no alert active. Until then every command,
acknowledgement, checkpoint, confirmation, resume and executor action lands on its timeline
even though the alert that started it auto-resolved long ago (points already in flight when
the brake held often clear the alert).
"""

from __future__ import annotations

from dataclasses import dataclass

from incidents.models import (
    ACTIVE_ALERT_STATUSES,
    FINAL_JOB_STATUSES,
    Incident,
    TimelineEntry,
    TimelineKind,
)

# Commands that hold or end training: after one, the episode needs a resume (or an end).
BRAKE_KINDS = ("checkpoint_and_pause", "pause_data", "terminate")
HEALTHY_STEPS_AFTER_RESUME = 10


@dataclass(frozen=True)
class EpisodeFacts:
    alerts_active: bool
    braked: bool
    job_final: bool
    resumed_at_step: int | None  # the step of the resume after the latest brake, if any


def episode_over(facts: EpisodeFacts, step: int | None) -> bool:
    """The pure rule (tests/incidents/test_episode.py, table-driven)."""
    if facts.alerts_active:
        return False
    if not facts.braked or facts.job_final:
        return True
    if facts.resumed_at_step is None or step is None:
        return False
    return step >= facts.resumed_at_step + HEALTHY_STEPS_AFTER_RESUME


def episode_facts(incident: Incident) -> EpisodeFacts:
    rows = TimelineEntry.objects.filter(incident_id=incident.pk)
    brake = (
        rows.filter(kind=TimelineKind.COMMAND_ISSUED, data__kind__in=BRAKE_KINDS)
        .order_by("-pk")
        .first()
    )
    resumed = None
    if brake is not None:
        resumed = rows.filter(kind=TimelineKind.RESUMED, pk__gt=brake.pk).order_by("pk").first()
    resumed_at = None
    if resumed is not None:
        resumed_at = resumed.step if resumed.step is not None else 0
    return EpisodeFacts(
        alerts_active=incident.alerts.filter(status__in=ACTIVE_ALERT_STATUSES).exists(),
        braked=brake is not None,
        job_final=incident.job.status in FINAL_JOB_STATUSES,
        resumed_at_step=resumed_at,
    )
