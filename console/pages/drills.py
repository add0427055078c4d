"""The drill pages: a team's scorecard (last pass per scenario, the trend of time to brake, a
"run drills" form for admins) and one drill's scorecard, line by line with its figures."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from breakers.drills import runs, workloads
from breakers.drills.launch import slurm_available
from breakers.drills.scenarios import SCENARIOS
from breakers.models import DrillRun, DrillWorkload
from console.api.person_auth import audit_context, signed_in
from console.pages.forms import attempt
from incidents.models import Team
from incidents.teams.access import role_in_team, visible_team_ids
from incidents.teams.authority import Action, decide

TREND_WIDTH, TREND_HEIGHT = 320, 60


def _team(request: HttpRequest, pk: int) -> Team:
    team = Team.objects.filter(pk=pk, pk__in=visible_team_ids(request.user)).first()
    if team is None:
        raise Http404("There is no such team.")
    return team


def trend_points(values: list[float]) -> str:
    """The polyline of the time-to-brake trend (oldest left), scaled to the chart's box."""
    if not values:
        return ""
    top = max(values) or 1.0
    step = TREND_WIDTH / max(1, len(values) - 1)
    return " ".join(
        f"{index * step:.1f},{TREND_HEIGHT - 4 - (value / top) * (TREND_HEIGHT - 8):.1f}"
        for index, value in enumerate(values)
    )


def _save_workload(request: HttpRequest, team: Team) -> None:
    data = {name: request.POST.get(name, "") for name in workloads.FIELDS}
    attempt(
        request,
        "The team's drill workload is saved."
        if data["command"].strip()
        else "The team's drills run the built-in workload again.",
        lambda: workloads.save_team_workload(
            signed_in(request), team.pk, data, context=audit_context(request)
        ),
    )


def _start_drills(request: HttpRequest, team: Team) -> None:
    chosen = request.POST.getlist("scenario") or ["all"]
    attempt(
        request,
        f"Drill set started: {', '.join(chosen)}. Each scorecard appears below when done.",
        lambda: runs.request_drills(
            team,
            chosen,
            actor=request.user,
            executor=request.POST.get("executor", "local"),
            workload=request.POST.get("workload", "builtin"),
            context=audit_context(request),
        ),
    )


@login_required
def team_drills_page(request: HttpRequest, pk: int) -> HttpResponse:
    team = _team(request, pk)
    may_run = decide(role_in_team(request.user, team.pk), Action.RUN_DRILL).allowed
    if request.method == "POST" and request.POST.get("form") == "workload":
        _save_workload(request, team)
        return redirect(f"/teams/{team.pk}/drills/")
    if request.method == "POST":
        _start_drills(request, team)
        return redirect(f"/teams/{team.pk}/drills/")
    latest = runs.last_runs_by_scenario(team)
    # The badge's link names the missing scenarios: those ticked, the others not.
    asked = set(request.GET.getlist("scenario")) & set(SCENARIOS)
    trend = runs.brake_trend(team)
    context: dict[str, Any] = {
        "team": team,
        "may_run": may_run,
        "scenarios": [
            {"scenario": s, "ticked": not asked or s.name in asked, **latest[s.name]}
            for s in SCENARIOS.values()
        ],
        "trend": trend,
        "trend_points": trend_points([run.brake_seconds or 0.0 for run in trend]),
        "trend_max": max((run.brake_seconds or 0.0 for run in trend), default=0.0),
        "trend_box": (TREND_WIDTH, TREND_HEIGHT),
        "recent": DrillRun.objects.filter(team=team).order_by("-pk")[:20],
        "executors": ["local", *(["slurm"] if slurm_available() else [])],
        "own_commands": workloads.team_commands_enabled(),
        "own": DrillWorkload.objects.filter(team=team).first(),
    }
    return render(request, "drills/team.html", context)


@login_required
def drill_page(request: HttpRequest, pk: int) -> HttpResponse:
    run = (
        DrillRun.objects.filter(pk=pk, team_id__in=visible_team_ids(request.user))
        .select_related("team", "job", "requested_by")
        .first()
    )
    if run is None:
        raise Http404("There is no such drill.")
    if run.status in ("queued", "running"):
        messages.info(request, "This drill is still running: reload for its scorecard.")
    context = {
        "run": run,
        "scenario": SCENARIOS.get(run.scenario),
        "checks": list(run.checks.all()),
    }
    return render(request, "drills/run.html", context)
