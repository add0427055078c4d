"""A scheduled drill set that did not pass pages the team.

Nobody watches the beat start a drill set at 03:17, so a failure would otherwise wait for the
next person to open the drills page: the braking configuration would be known broken and not
said. Every run of a scheduled set asks, after its own verdict commits, whether the set is
complete (``runs._after_finish``); the one that completes it pages — once per set: the set's
rows are locked, and ``failure_paged_at`` is stamped on every one of them in the same
transaction that queues the deliveries (the queueing fails, the stamp rolls back with it).
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from breakers.models import DrillRun, DrillStatus
from breakers.models.drills import FINISHED_DRILL_STATUSES
from incidents.notifications.messages import console_link
from incidents.notifications.policy import notify_team_admins


def page_failed_set(drill_set: uuid.UUID | str) -> list[int]:
    """Page the on-call person and the admins when the complete scheduled set did not pass;
    the delivery ids ([] when the set is still running, passed, was paged, or is no
    scheduled set). Idempotent: a retry or the last two runs finishing together page once."""
    with transaction.atomic():
        runs = list(
            DrillRun.objects.select_for_update()
            .select_related("team")
            .filter(drill_set=drill_set)
            .order_by("pk")
        )
        if not runs or not all(r.scheduled for r in runs):
            return []
        if any(r.status not in FINISHED_DRILL_STATUSES for r in runs):
            return []  # the set's last verdict asks again
        if any(r.failure_paged_at is not None for r in runs):
            return []
        failed = [r for r in runs if r.status != DrillStatus.PASSED]
        if not failed:
            return []
        DrillRun.objects.filter(pk__in=[r.pk for r in runs]).update(failure_paged_at=timezone.now())
        first_line, body = failure_message(runs, failed)
        return notify_team_admins(runs[0].team_id, first_line, body, purpose="drill_failure")


def failure_message(runs: list[DrillRun], failed: list[DrillRun]) -> tuple[str, str]:
    team = runs[0].team
    names = ", ".join(f"{r.scenario} {r.status}" for r in failed)
    first_line = (
        f"Scheduled drill of {team.name} did not pass: {len(failed)} of {len(runs)} "
        f"scenarios ({names})"
    )
    lines = [
        f"The monthly drill set of rule-set version v{runs[0].ruleset_version} ran on its own; "
        "these scenarios did not pass, so braking may not work as configured:",
        "",
    ]
    for run in failed:
        lines.append(f"- {run.scenario}: {run.status} — {_why(run)}")
        lines.append(f"  {console_link(reverse('drill-page', args=[run.pk]))}")
    lines += ["", f"Run them again: {console_link(reverse('team-drills-page', args=[team.pk]))}"]
    return first_line, "\n".join(lines)


def _why(run: DrillRun) -> str:
    if run.status == DrillStatus.ERROR:
        return run.error.splitlines()[0][:300] if run.error else "the drill could not run"
    failing = run.checks.filter(passed=False).order_by("position")
    return "; ".join(f"{c.name}: {c.measured}" for c in failing)[:300] or "no line passed"
