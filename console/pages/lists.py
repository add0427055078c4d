"""Silences (list and create), the incidents list and the audit trail (managers)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from breakers.detection.rulesets import rule_keys
from console.api.person_auth import audit_context, signed_in
from console.board import roles_by_team
from console.pages.forms import attempt, int_field, utc_field
from core.errors import NotFound
from incidents.models import AuditEntry, Incident, Job, Team
from incidents.silences import create_silence, end_silence, visible_silences
from incidents.teams.access import visible_team_ids
from incidents.teams.audit import audit_read_refusal
from incidents.teams.authority import Action, decide, role_rank

PAGE = 200
DURATIONS = [
    ("1", "1 hour"),
    ("2", "2 hours"),
    ("4", "4 hours"),
    ("12", "12 hours"),
    ("24", "1 day"),
    ("72", "3 days"),
]


def _create(request: HttpRequest) -> None:
    def call() -> None:
        now = timezone.now()
        starts = utc_field(request, "starts_at", required=False) or now
        ends = utc_field(request, "ends_at", required=False)
        if ends is None:
            hours = int_field(request, "hours") or 0
            ends = starts + timedelta(hours=hours)
        create_silence(
            signed_in(request),
            int_field(request, "team_id") or 0,
            job_id=int_field(request, "job_id", required=False),
            rule_key=request.POST.get("rule_key", ""),
            starts_at=starts,
            ends_at=ends,
            reason=request.POST.get("reason", ""),
            context=audit_context(request),
        )

    attempt(request, "Silence created: those pages wait until it ends; brakes do not.", call)


def _end(request: HttpRequest) -> None:
    attempt(
        request,
        "Silence ended: pages go out again.",
        lambda: end_silence(
            signed_in(request),
            int_field(request, "silence_id") or 0,
            context=audit_context(request),
        ),
    )


@login_required
def silences_page(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        if request.POST.get("form") == "end":
            _end(request)
        else:
            _create(request)
        return redirect("/silences/")
    now = timezone.now()
    roles = roles_by_team(request.user)
    team = request.GET.get("team", "")
    only = int(team) if team.isascii() and team.isdigit() and len(team) < 12 else None
    try:
        found = visible_silences(signed_in(request), team_id=only)
    except NotFound:
        raise Http404("There is no such team.") from None
    silences = list(found.order_by("-ends_at", "-id")[:PAGE])
    managed = [
        t
        for t in visible_team_ids(request.user)
        if decide(roles.get(t), Action.MANAGE_SILENCES).allowed
    ]
    context = {
        "current": [s for s in silences if s.starts_at <= now < s.ends_at],
        "upcoming": [s for s in silences if s.starts_at > now],
        "past": [s for s in silences if s.ends_at <= now][:30],
        "can_end": set(managed),
        "teams": Team.objects.filter(pk__in=managed).order_by("name"),
        # A drill's sandbox jobs page nobody: nothing there to silence.
        "jobs": Job.objects.filter(team_id__in=managed, drill_sandbox=False).order_by(
            "team__name", "name"
        ),
        "durations": DURATIONS,
        "rule_keys": rule_keys(managed),
    }
    return render(request, "silences.html", context)


@login_required
def incidents_page(request: HttpRequest) -> HttpResponse:
    teams = visible_team_ids(request.user)
    incidents = (
        Incident.objects.filter(job__team_id__in=teams)
        .select_related("job", "job__team", "assignee")
        .order_by("-opened_at", "-id")[:PAGE]
    )
    return render(request, "incidents.html", {"incidents": incidents})


@login_required
def audit_page(request: HttpRequest) -> HttpResponse:
    roles = roles_by_team(request.user)
    readable = [t for t, role in roles.items() if audit_read_refusal(role) is None]
    if not readable:
        refusal = audit_read_refusal(max(roles.values(), default=None, key=role_rank)) or ""
        return render(request, "audit.html", {"refusal": refusal}, status=403)
    entries = AuditEntry.objects.filter(team_id__in=readable).select_related("user", "team")
    only = request.GET.get("allowed")
    if only in ("true", "false"):
        entries = entries.filter(allowed=only == "true")
    return render(request, "audit.html", {"entries": entries[:PAGE], "only": only})
