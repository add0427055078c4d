"""Web pages (server-rendered; small plain JavaScript keeps them live).

Every page is login-only and team-scoped: an object of another team is a 404, like one that
does not exist. Each page also answers ``?partial=<part>`` with just its live part, which the
page's script fetches again when the websocket says something changed (one renderer, the
template, and every button decided by the server: see ``console.board``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularSwaggerSplitView

from breakers import metrics as history
from console import board
from console.api.jobs import visible_jobs
from console.incident_board import incident_state
from console.ranks_table import RanksQuery, ranks_page
from console.security import api_docs_policy
from incidents import silences as silencing
from incidents.alerts.lifecycle import alert_payload
from incidents.models import (
    ACTIVE_ALERT_STATUSES,
    Alert,
    AlertStatus,
    EscalationRequest,
    EscalationStatus,
    Incident,
    Team,
)
from incidents.teams.access import visible_team_ids
from incidents.teams.oncall import on_call_summary

RECENT = 50
# Charts every training job has, shown (empty) before its first point so they can grow live.
STANDARD_NAMES = ["loss", "grad_norm", "lr"]


def _partial(request: HttpRequest) -> str:
    return request.GET.get("partial", "")


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    rows = board.dashboard_rows(request.user)
    if _partial(request):
        return render(request, "partials/dashboard_rows.html", {"rows": rows})
    drills = visible_jobs(request.user).filter(drill_sandbox=True).count()
    on_call = on_call_now_and_next(request)
    context = {"rows": rows, "drill_jobs": drills, "on_call": on_call}
    return render(request, "dashboard.html", context)


def on_call_now_and_next(request: HttpRequest) -> list[dict]:
    """Per team of the user: who is on call now, and who next from when."""
    teams = Team.objects.filter(pk__in=visible_team_ids(request.user)).order_by("name")
    return [{"team": team, "summary": on_call_summary(team)} for team in teams]


@login_required
def job_page(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request.user), pk=pk)
    if _partial(request) == "ranks":  # a page, a sort or a search of the ranks table
        table = ranks_page(job.pk, RanksQuery.parse(request.GET))
        return render(request, "partials/job_ranks.html", {"table": table})
    if _partial(request) == "checkpoints":
        return render(request, "partials/checkpoints.html", {"job_id": job.pk})
    state = board.job_state(request.user, job)
    if _partial(request) == "state":
        return render(request, "partials/job_state.html", state)
    names = history.metric_names(job.pk)
    groups = history.metric_groups(sorted(set(names) | set(STANDARD_NAMES)))
    return render(request, "job.html", {**state, "groups": groups})


@login_required
def alerts_page(request: HttpRequest) -> HttpResponse:
    teams = visible_team_ids(request.user)
    roles = board.roles_by_team(request.user)
    visible = Alert.objects.filter(job__team_id__in=teams).select_related("job", "snoozed_by")
    active = visible.filter(status__in=ACTIVE_ALERT_STATUSES).order_by("-severity", "-raised_at")
    resolved = visible.filter(status=AlertStatus.RESOLVED).order_by("-resolved_at")[:RECENT]

    silences = list(silencing.active().filter(team_id__in=teams).select_related("created_by"))

    def rows(alerts):
        alerts = list(alerts)
        acked = board.acknowledged_by([a.pk for a in alerts])
        return [
            {
                "alert": alert_payload(a),
                "buttons": board.alert_buttons(roles.get(a.job.team_id), a),
                "silence": None
                if a.status == AlertStatus.RESOLVED
                else silencing.matching(silences, a),
                "acknowledged_by": acked.get(a.pk),
                "snoozed": board.snooze_of(a),
            }
            for a in alerts
        ]

    context = {"active": rows(active), "resolved": rows(resolved), "team_ids": teams}
    template = "partials/alerts_list.html" if _partial(request) else "alerts.html"
    return render(request, template, context)


@login_required
def approvals_page(request: HttpRequest) -> HttpResponse:
    teams = visible_team_ids(request.user)
    roles = board.roles_by_team(request.user)
    requests = EscalationRequest.objects.filter(job__team_id__in=teams).select_related(
        "job", "requested_by", "decided_by", "alert"
    )
    pending = requests.filter(status=EscalationStatus.PENDING).order_by("requested_at")
    if _partial(request) == "badge":  # the nav's count, kept live on every page
        context = {"pending_count": pending.count(), "team_ids": teams}
        return render(request, "partials/approvals_badge.html", context)
    decided = requests.exclude(status=EscalationStatus.PENDING).order_by("-requested_at")[:RECENT]

    def rows(items):
        return [
            {
                "request": r,
                "buttons": board.escalation_buttons(request.user, roles.get(r.job.team_id), r),
            }
            for r in items
        ]

    context = {"pending": rows(pending), "decided": rows(decided), "team_ids": teams}
    template = "partials/approvals_list.html" if _partial(request) else "approvals.html"
    return render(request, template, context)


@login_required
def incident_page(request: HttpRequest, pk: int) -> HttpResponse:
    incident = get_object_or_404(
        Incident.objects.select_related("job", "job__team", "assignee"),
        pk=pk,
        job__team_id__in=visible_team_ids(request.user),
    )
    context = incident_state(request.user, incident)
    template = "partials/incident_live.html" if _partial(request) else "incident.html"
    return render(request, template, context)


class ApiDocsView(SpectacularSwaggerSplitView):
    """Swagger UI for the schema, under a policy that allows its one inline style."""

    @extend_schema(exclude=True)
    def get(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = super().get(request, *args, **kwargs)
        response["Content-Security-Policy"] = api_docs_policy(request)
        return response
