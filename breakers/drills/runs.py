"""Drill runs, the service every front door calls (API, UI, ``manage.py drill``).

``request_drills`` checks the authority (``run_drill``: admins), stores one queued
``DrillRun`` per scenario under one drill set and, after commit, hands the set to
``breakers.drills.runner`` in a process of its own (a drill lasts tens of seconds and waits
on the Celery workers' evaluations: it must never occupy a worker). Each status change is a
compare-and-swap along ``DRILL_TRANSITIONS``; a finished run's scorecard lines are written in
the transaction that finishes it and never change afterwards.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from breakers.detection import rulesets
from breakers.drills import workloads
from breakers.drills.redaction import scrub
from breakers.drills.scenarios import SCENARIOS, Scenario, resolve
from breakers.drills.scorecard import Line
from breakers.drills.tasks import page_failed_set_task
from breakers.models import DRILL_TRANSITIONS, DrillCheck, DrillRun, DrillStatus
from breakers.models.drills import FINISHED_DRILL_STATUSES, OPEN_DRILL_STATUSES
from core.errors import Conflict, InvalidInput
from core.transitions import compare_and_swap
from incidents.models import Team
from incidents.teams.access import role_in_team
from incidents.teams.audit import Attempt, AuditContext, audited
from incidents.teams.authority import Action, decide

log = logging.getLogger(__name__)
EXECUTORS = ("local", "slurm")


def request_drills(
    team: Team,
    scenarios: Iterable[str],
    *,
    actor: Any = None,
    executor: str = "local",
    corrupt_checkpoint: bool = False,
    context: AuditContext | None = None,
    launch: bool = True,
    schedule_key: str = "",
    workload: str = "builtin",
) -> list[DrillRun]:
    """Queue one drill set (403 below admin, 400 naming an unknown scenario or executor).
    ``actor`` None: the operator's command line or the schedule (audited as the system). With
    ``launch``, the set starts after commit in a background ``manage.py drill --drill-set``
    process. ``schedule_key``: the schedule's period key (409 when that set was queued
    already); a scheduled set that does not pass pages the team (``page_failed_set``).
    ``workload``: ``builtin`` or ``team`` (the team's own command, ``workloads.py``)."""
    with audited(actor, Action.RUN_DRILL, "team", team.pk, context) as attempt:
        attempt.team_id = team.pk
        _authorise(attempt, actor, team)
        chosen = _checked_scenarios(scenarios, executor)
        command, verify_command = _workload_commands(team, workload)
        drill_set = uuid.uuid4()
        fields = {
            "team": team,
            "drill_set": drill_set,
            "executor": executor,
            "requested_by": actor,
            "corrupt_checkpoint": corrupt_checkpoint,
            "schedule_key": schedule_key,
            "command": command,
            "verify_command": verify_command,
            # The version the drill vouches for ("drilled" is per version: a rule change after
            # this needs the drill again). Read before the runs exist: the one in force.
            "ruleset_version": rulesets.current_version(team).number,
        }
        runs = _store_set([scenario.name for scenario in chosen], fields, launch)
        attempt.succeeded(f"drill set {drill_set}: {', '.join(s.name for s in chosen)}")
    return runs


def _authorise(attempt: Attempt, actor: Any, team: Team) -> None:
    if actor is not None:
        attempt.check(decide(role_in_team(actor, team.pk), Action.RUN_DRILL))
    else:  # audited as allowed: the row said "refused" for every scheduled set before
        attempt.allowed = True
        attempt.reason = "The drill schedule or an operator at the server (manage.py drill)."


def _checked_scenarios(scenarios: Iterable[str], executor: str) -> list[Scenario]:
    try:
        chosen = resolve(list(scenarios))
    except ValueError as error:
        raise InvalidInput(str(error), fields={"scenarios": str(error)}) from None
    if executor not in EXECUTORS:
        raise InvalidInput(
            f"Unknown executor {executor!r}.",
            fields={"executor": f"must be one of {', '.join(EXECUTORS)}"},
        )
    return chosen


def _store_set(scenarios: list[str], fields: dict[str, Any], launch: bool) -> list[DrillRun]:
    """One run per scenario, all or none; launched after commit."""
    try:
        with transaction.atomic():
            runs = [DrillRun.objects.create(scenario=name, **fields) for name in scenarios]
            if launch:
                drill_set = fields["drill_set"]
                transaction.on_commit(lambda: launch_drill_set(drill_set))
    except IntegrityError:  # drill_scheduled_once: another beat queued this set first
        key = fields["schedule_key"]
        raise Conflict(f"The scheduled drill set {key} is queued already.") from None
    return runs


WORKLOADS = ("builtin", "team")


def _workload_commands(team: Team, workload: str) -> tuple[str, str]:
    """The command lines the runs record ("" and "" for the built-in workload), checked again
    now: the program may have gone since the admin set it."""
    if workload not in WORKLOADS:
        raise InvalidInput(
            f"Unknown workload {workload!r}.", fields={"workload": "builtin or team"}
        )
    if workload == "builtin":
        return "", ""
    own = workloads.team_workload(team)
    if own is None:
        why = (
            "the team has set no command"
            if workloads.team_commands_enabled()
            else (workloads.NOT_ENABLED)
        )
        raise InvalidInput(f"No own drill workload: {why}", fields={"workload": why})
    for name in workloads.FIELDS:
        try:
            workloads.parse_command(getattr(own, name), name)
        except InvalidInput as error:
            raise InvalidInput(error.detail, fields={"workload": error.detail}) from None
    return own.command, own.verify_command


def launch_drill_set(drill_set: uuid.UUID) -> None:
    """The drill set in a process of its own (see the module doc); its output goes to a log
    file under the data folder."""
    folder = drill_folder() / str(drill_set)
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(settings.BASE_DIR / "manage.py"), "drill"]
    with open(folder / "runner.log", "ab") as output:
        subprocess.Popen(
            [*command, "--drill-set", str(drill_set)],
            cwd=settings.BASE_DIR,
            stdout=output,
            stderr=subprocess.STDOUT,
            env=os.environ.copy(),
            start_new_session=True,  # outlives the request that started it
        )


def drill_folder() -> Path:
    """Where sandboxes write (checkpoints, logs): DRILL_DIR (env BRAKELINE_DRILL_DIR)."""
    return Path(settings.DRILL_DIR)


def move(run: DrillRun, new: str, **fields: Any) -> bool:
    """One compare-and-swap along the transition table; False when another writer won."""
    won = compare_and_swap(
        DrillRun,
        run.pk,
        table=DRILL_TRANSITIONS,
        expected=[run.status],
        new=new,
        **fields,
    )
    if won:
        run.refresh_from_db()
    return won


def start(run: DrillRun) -> None:
    if run.status != DrillStatus.QUEUED or not move(
        run, DrillStatus.RUNNING, started_at=timezone.now()
    ):
        raise Conflict(f"Drill #{run.pk} is {run.status}: it cannot start.")


def finish(run: DrillRun, lines: list[Line], **figures: Any) -> DrillRun:
    """Passed only when every line passed; the lines and the verdict in one transaction."""
    status = DrillStatus.PASSED if lines and all(line.passed for line in lines) else "failed"
    with transaction.atomic():
        if run.status != DrillStatus.RUNNING or not move(
            run, status, finished_at=timezone.now(), **figures
        ):
            raise Conflict(f"Drill #{run.pk} is already {run.status}.")
        _after_finish(run)
        DrillCheck.objects.bulk_create(
            DrillCheck(
                run=run,
                position=position,
                name=line.name,
                passed=line.passed,
                measured=scrub(line.measured)[:200],
                expectation=line.expectation[:200],
                detail=scrub(line.detail),
            )
            for position, line in enumerate(lines)
        )
    return run


def fail_with_error(run: DrillRun, error: str) -> None:
    """The drill could not be carried out (no worker, the sandbox did not start...)."""
    run.refresh_from_db()
    if run.status not in FINISHED_DRILL_STATUSES:
        with transaction.atomic():
            error = scrub(error)[:4000]
            if move(run, DrillStatus.ERROR, finished_at=timezone.now(), error=error):
                _after_finish(run)


def _after_finish(run: DrillRun) -> None:
    """A scheduled run's verdict may complete its set: the task pages when the set did not
    pass (nobody watched it start). Each run's commit asks; the task pages once per set."""
    if run.scheduled:
        drill_set = str(run.drill_set)
        transaction.on_commit(lambda: page_failed_set_task.delay(drill_set))


def expire_stale_runs(*, now: datetime | None = None) -> list[int]:
    """Runs queued or running for longer than ``DRILL_RUN_TIMEOUT_SECONDS`` lost their runner
    (its process died with its machine, or never started): "error", so the badge, the team's
    page and — for a scheduled set — the on-call person learn it, instead of "running" for ever."""
    now = now or timezone.now()
    limit = now - timedelta(seconds=float(settings.DRILL_RUN_TIMEOUT_SECONDS))
    stale = DrillRun.objects.filter(status__in=OPEN_DRILL_STATUSES, created_at__lt=limit)
    expired = []
    for run in stale.order_by("pk"):
        since = run.started_at or run.created_at
        fail_with_error(
            run,
            f"the drill runner stopped: no verdict {int((now - since).total_seconds())} s after "
            f"it {'started' if run.started_at else 'was queued'} "
            f"(BRAKELINE_DRILL_RUN_TIMEOUT_SECONDS={settings.DRILL_RUN_TIMEOUT_SECONDS:g})",
        )
        run.refresh_from_db()
        if run.status == DrillStatus.ERROR:
            expired.append(run.pk)
    return expired


def last_runs_by_scenario(team: Team) -> dict[str, dict[str, DrillRun | None]]:
    """Per scenario: its latest finished run and its latest passing one (the team's page)."""
    result: dict[str, dict[str, DrillRun | None]] = {}
    finished = DrillRun.objects.filter(team=team, status__in=FINISHED_DRILL_STATUSES)
    for name in SCENARIOS:
        of = finished.filter(scenario=name).order_by("-finished_at", "-pk")
        result[name] = {
            "last": of.first(),
            "last_pass": of.filter(status=DrillStatus.PASSED).first(),
        }
    return result


def brake_trend(team: Team, limit: int = 30) -> list[DrillRun]:
    """The team's latest finished runs with a measured time to brake, oldest first."""
    runs = DrillRun.objects.filter(
        team=team, status__in=FINISHED_DRILL_STATUSES, brake_seconds__isnull=False
    ).order_by("-finished_at", "-pk")[:limit]
    return list(reversed(runs))
